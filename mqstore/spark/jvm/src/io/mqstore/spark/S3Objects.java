package io.mqstore.spark;

import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.Proxy;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.ZonedDateTime;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.Flow;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The objects of an s3:// tier, read with GETs of the JDK's HTTP clients (no library to download): path-style
 * URLs, scheme://endpoint/bucket/prefix/key, each key segment percent-encoded once; a range is one GET with
 * `Range: bytes=a-b`, which S3 answers 206 with exactly those bytes. Requests are signed with AWS Signature
 * Version 4 ({@link SigV4}: host, range, x-amz-content-sha256 of the empty payload, x-amz-date,
 * x-amz-security-token with a session token) when the tier has keys, else sent unsigned.
 *
 * <pre>
 *   ANSWER                                     OUTCOME
 *   206 (or 200: the server ignored Range)     the bytes; fewer than asked: tier.object-size (CorruptLogException)
 *   404 NoSuchKey                              tier.object-missing for a range; null for readAll (no manifest)
 *   416 InvalidRange                           tier.object-size: the object ends before the range starts
 *   5xx, a connection reset or time-out        retried, ATTEMPTS_MAX in all, waits doubling from RETRY_WAIT_MS
 *   anything else (403, 301 wrong region...)   IOException naming the object, S3's code and message
 * </pre>
 *
 * A range (readRange) is read by HttpURLConnection, its body straight into the reader's array: on 256 MiB of
 * 16 MiB ranges from the test server it cost the JVM 0.1 CPU s against 0.3 through HttpClient's buffers
 * (bench/results/spark_tier.md), and a tier scan is CPU-bound. A whole object (readAll: the manifest) is read
 * by one HttpClient, which serves the JVM (it pools connections and is thread-safe); both speak HTTP/1.1 (S3
 * speaks no HTTP/2, and HttpClient's h2c upgrade attempt confuses some S3-compatible servers). A 206 whose
 * Content-Range does not start at the asked offset is refused: its bytes are not the range's. Messages name the
 * object by its shown URI; no key, secret or signature is put in one.
 */
final class S3Objects implements TierObjects {
    static final int ATTEMPTS_MAX = 4;
    static final long RETRY_WAIT_MS = 200;
    static final Duration CONNECT_TIMEOUT = Duration.ofSeconds(10);
    static final Duration RESPONSE_TIMEOUT = Duration.ofSeconds(120);  // until the response's headers
    static final int ERROR_BODY_BYTES_MAX = 4096;
    private static final Pattern XML_CODE = Pattern.compile("<Code>([^<]{0,200})</Code>");
    private static final Pattern CONTENT_RANGE = Pattern.compile("bytes (\\d{1,18})-\\d{1,18}/(?:\\d{1,18}|\\*)");
    private static final Pattern XML_MESSAGE = Pattern.compile("<Message>([^<]{0,500})</Message>");
    /** "httpclient": ranges are read by HttpClient, as before HttpURLConnection (bench/spark_tier.py's A/B). */
    static final String RANGE_CLIENT_PROPERTY = "io.mqstore.spark.s3RangeClient";
    private static HttpClient shared;

    private final TierLocation location;
    private final TierLocation.S3Settings s3;

    S3Objects(TierLocation location) {
        this.location = location;
        this.s3 = location.s3;
    }

    private static synchronized HttpClient client() {
        if (shared == null) {
            shared = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(CONNECT_TIMEOUT)
                    .followRedirects(HttpClient.Redirect.NEVER).build();
        }
        return shared;
    }

    /** An S3 answer that retrying will not change (4xx): not retried. */
    static final class Refused extends IOException {
        private static final long serialVersionUID = 1L;

        Refused(String message) {
            super(message);
        }
    }

    @Override
    public byte[] readAll(String key, int bytesMax) throws IOException {
        return withRetries(key, () -> {
            HttpResponse<InputStream> response = send(key, -1, 0, HttpResponse.BodyHandlers.ofInputStream());
            try (InputStream body = response.body()) {
                if (response.statusCode() != 200) {
                    String text = errorBody(body);
                    if (response.statusCode() == 404 && !text.contains("<Code>NoSuchBucket</Code>")) {
                        return null;
                    }
                    throw failure(key, response, text);
                }
                long length = response.headers().firstValueAsLong("content-length").orElse(-1);
                if (length > bytesMax) {
                    throw new Refused(location.display(key) + " is " + length + " bytes, more than " + bytesMax);
                }
                byte[] data = body.readNBytes(bytesMax + 1);
                if (data.length > bytesMax) {
                    throw new Refused(location.display(key) + " is more than " + bytesMax + " bytes");
                }
                return data;
            }
        });
    }

    @Override
    public void readRange(String key, long offset, byte[] into, int at, int count) throws IOException {
        if ("httpclient".equals(System.getProperty(RANGE_CLIENT_PROPERTY))) {
            readRangeByHttpClient(key, offset, into, at, count);
            return;
        }
        long end = Math.addExact(offset, count);
        withRetries(key, () -> {
            HttpURLConnection connection = open(key, offset, count);
            try {
                int status = connection.getResponseCode();
                if (status != 206 && status != 200) {
                    String text = errorText(connection);
                    if (status == 404 && !text.contains("<Code>NoSuchBucket</Code>")) {
                        throw TierObjects.missing(location, key, offset);
                    }
                    if (status == 416) {
                        throw TierObjects.shorter(location, key, offset, end);
                    }
                    throw failure(key, status, connection.getHeaderField("x-amz-bucket-region"), text);
                }
                if (status == 206) {
                    checkRangeStart(key, offset, connection.getHeaderField("Content-Range"));
                }
                int filled;
                try (InputStream body = connection.getInputStream()) {
                    filled = readBody(body, status == 200 ? offset : 0, into, at, count);
                }
                if (filled < count) {
                    throw TierObjects.shorter(location, key, offset + filled, end);
                }
                return null;
            } catch (IOException | RuntimeException e) {
                connection.disconnect();  // a connection left mid-answer is not kept for the next GET
                throw e;
            }
        });
    }

    /**
     * A range's body read straight into the reader's array, [at, at + count) of `into` (after skipping `skip`
     * bytes: a 200 from a server that ignored Range); the bytes read, fewer than `count` when the body ends first.
     * The rest of the body, if any, is read and dropped, so that the connection is kept for the next GET.
     */
    static int readBody(InputStream body, long skip, byte[] into, int at, int count) throws IOException {
        if (skip > 0) {
            try {
                body.skipNBytes(skip);
            } catch (EOFException e) {
                return 0;
            }
        }
        int filled = 0;
        while (filled < count) {
            int read = body.read(into, at + filled, count - filled);
            if (read < 0) {
                return filled;
            }
            filled += read;
        }
        body.transferTo(OutputStream.nullOutputStream());
        return filled;
    }

    /** Whether a Content-Range ("bytes a-b/total") starts at `offset`. */
    static boolean rangeStartsAt(long offset, String contentRange) {
        Matcher range = CONTENT_RANGE.matcher(contentRange == null ? "" : contentRange.trim());
        try {
            return range.matches() && Long.parseLong(range.group(1)) == offset;
        } catch (NumberFormatException e) {  // more digits than a long holds
            return false;
        }
    }

    /** Refused unless a 206's Content-Range starts at `offset`, the range asked for. */
    void checkRangeStart(String key, long offset, String contentRange) throws Refused {
        if (!rangeStartsAt(offset, contentRange)) {
            throw new Refused("GET " + location.display(key) + " from " + s3 + ": asked for bytes from " + offset
                    + ", answered 206 with Content-Range " + contentRange);
        }
    }

    private static String errorText(HttpURLConnection connection) throws IOException {
        try (InputStream body = connection.getErrorStream()) {
            return body == null ? "" : errorBody(body);
        }
    }

    /** readRange by HttpClient, its body copied from HttpClient's buffers (RangeBody): the A/B's other side. */
    private void readRangeByHttpClient(String key, long offset, byte[] into, int at, int count) throws IOException {
        long end = Math.addExact(offset, count);
        withRetries(key, () -> {
            // a 206 for another range copies nothing into the reader's array (taken as an error body), then is refused
            HttpResponse<RangeBody> response = send(key, offset, count,
                    info -> new RangeBody(info.statusCode() == 206 && !rangeStartsAt(offset,
                            info.headers().firstValue("Content-Range").orElse(null)) ? 0 : info.statusCode(),
                            into, at, count, offset));
            RangeBody body = response.body();
            int status = response.statusCode();
            if (status == 206) {
                checkRangeStart(key, offset, response.headers().firstValue("Content-Range").orElse(null));
            }
            if (status != 206 && status != 200) {
                String text = body.errorText();
                if (status == 404 && !text.contains("<Code>NoSuchBucket</Code>")) {
                    throw TierObjects.missing(location, key, offset);
                }
                if (status == 416) {
                    throw TierObjects.shorter(location, key, offset, end);
                }
                throw failure(key, response, text);
            }
            if (body.filled < count) {
                throw TierObjects.shorter(location, key, offset + body.filled, end);
            }
            return null;
        });
    }

    /**
     * A range's body, copied from HttpClient's buffers straight into the reader's array as they arrive (no stream
     * in between): [at, at + count) of `into` for a 206, the same bytes after skipping `offset` for a 200 (a server
     * that ignored Range), and up to ERROR_BODY_BYTES_MAX bytes of text for any other answer. `filled` counts the
     * bytes copied; more than `count` are dropped.
     */
    static final class RangeBody implements HttpResponse.BodySubscriber<RangeBody> {
        private final CompletableFuture<RangeBody> done = new CompletableFuture<>();
        private final boolean ranged;
        private final byte[] into;
        private final int at;
        private final int count;
        private long skip;
        private final ByteArrayOutputStream error = new ByteArrayOutputStream();
        private Flow.Subscription subscription;
        int filled;

        RangeBody(int status, byte[] into, int at, int count, long offset) {
            this.ranged = status == 206 || status == 200;
            this.into = into;
            this.at = at;
            this.count = count;
            this.skip = status == 200 ? offset : 0;
        }

        String errorText() {
            return error.toString(StandardCharsets.UTF_8);
        }

        @Override
        public void onSubscribe(Flow.Subscription subscription) {
            this.subscription = subscription;
            subscription.request(1);
        }

        @Override
        public void onNext(List<ByteBuffer> buffers) {
            for (ByteBuffer buffer : buffers) {
                if (!ranged) {
                    byte[] part = new byte[Math.max(0, Math.min(buffer.remaining(), ERROR_BODY_BYTES_MAX - error.size()))];
                    buffer.get(part);
                    error.write(part, 0, part.length);
                    continue;
                }
                int skipped = (int) Math.min(skip, buffer.remaining());
                buffer.position(buffer.position() + skipped);
                skip -= skipped;
                int take = Math.min(buffer.remaining(), count - filled);
                buffer.get(into, at + filled, take);
                filled += take;
            }
            subscription.request(1);
        }

        @Override
        public void onError(Throwable error) {
            done.completeExceptionally(error);
        }

        @Override
        public void onComplete() {
            done.complete(this);
        }

        @Override
        public CompletionStage<RangeBody> getBody() {
            return done;
        }
    }

    private interface Attempt<T> {
        T run() throws IOException, InterruptedException;
    }

    /** `attempt`, again after a wait when it fails with an I/O error other than a refusal. */
    private <T> T withRetries(String key, Attempt<T> attempt) throws IOException {
        for (int number = 1; ; number++) {
            try {
                return attempt.run();
            } catch (Refused e) {
                throw e;
            } catch (IOException e) {
                if (number >= ATTEMPTS_MAX) {
                    throw new IOException("GET " + location.display(key) + " failed " + number + " times, the last: "
                            + e, e);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new InterruptedIOException("interrupted reading " + location.display(key));
            }
            try {
                Thread.sleep(RETRY_WAIT_MS << (number - 1));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new InterruptedIOException("interrupted reading " + location.display(key));
            }
        }
    }

    /** A signed GET of `key`, of `count` bytes from `offset` (offset < 0: the whole object), by HttpClient. */
    private <T> HttpResponse<T> send(String key, long offset, int count, HttpResponse.BodyHandler<T> handler)
            throws IOException, InterruptedException {
        Map<String, String> headers = new LinkedHashMap<>();
        URI uri = signed(key, offset, count, headers);
        HttpRequest.Builder request = HttpRequest.newBuilder(uri).GET().timeout(RESPONSE_TIMEOUT);
        for (Map.Entry<String, String> header : headers.entrySet()) {
            if (!header.getKey().equals("host")) {  // HttpClient sets Host from the URI, as hostHeader spells it
                request.header(header.getKey(), header.getValue());
            }
        }
        return client().send(request.build(), handler);
    }

    /**
     * A signed GET of `count` bytes of `key` from `offset`, by HttpURLConnection, its answer not yet read: its
     * body is read by the caller straight into the reader's array (readBody), which costs the JVM a third of the
     * CPU HttpClient's buffers and copies do a byte (bench/results/spark_tier.md). No proxy, no redirect, as
     * the HttpClient's; connections are kept alive by the JDK's cache between GETs.
     */
    private HttpURLConnection open(String key, long offset, int count) throws IOException {
        Map<String, String> headers = new LinkedHashMap<>();
        URI uri = signed(key, offset, count, headers);
        HttpURLConnection connection = (HttpURLConnection) uri.toURL().openConnection(Proxy.NO_PROXY);
        connection.setInstanceFollowRedirects(false);
        connection.setConnectTimeout((int) CONNECT_TIMEOUT.toMillis());
        connection.setReadTimeout((int) RESPONSE_TIMEOUT.toMillis());
        for (Map.Entry<String, String> header : headers.entrySet()) {
            if (!header.getKey().equals("host")) {  // set from the URL, as hostHeader spells it
                connection.setRequestProperty(header.getKey(), header.getValue());
            }
        }
        return connection;
    }

    /** The URI of `key` and, into `headers`, the headers of its GET (module docstring), signed when keyed. */
    private URI signed(String key, long offset, int count, Map<String, String> headers) {
        String objectKey = location.root.isEmpty() ? key : location.root + "/" + key;
        String path = "/" + SigV4.uriEncode(s3.bucket, false) + "/" + SigV4.uriEncode(objectKey, true);
        URI uri = URI.create(s3.scheme + "://" + s3.endpoint + path);
        headers.put("host", hostHeader(uri));
        if (offset >= 0) {
            headers.put("range", "bytes=" + offset + "-" + Math.addExact(offset, count - 1L));
        }
        headers.put("x-amz-content-sha256", SigV4.EMPTY_PAYLOAD_SHA256);
        headers.put("x-amz-date", SigV4.amzDate(ZonedDateTime.now()));
        if (s3.sessionToken != null) {
            headers.put("x-amz-security-token", s3.sessionToken);
        }
        if (s3.accessKey != null) {
            headers.put("authorization", SigV4.authorization("GET", path, "", headers, SigV4.EMPTY_PAYLOAD_SHA256,
                    s3.accessKey, s3.secretKey, s3.region, "s3"));
        }
        return uri;
    }

    /** The Host header HttpClient sends for `uri`: the host, and the port unless it is the scheme's default. */
    static String hostHeader(URI uri) {
        int port = uri.getPort();
        boolean standard = port == -1 || (port == 443 && uri.getScheme().equals("https"))
                || (port == 80 && uri.getScheme().equals("http"));
        return standard ? uri.getHost() : uri.getHost() + ":" + port;
    }

    private static String errorBody(InputStream body) throws IOException {
        return new String(body.readNBytes(ERROR_BODY_BYTES_MAX), StandardCharsets.UTF_8);
    }

    /** The IOException for an answer that is not the object's bytes: 5xx retried, the rest refused. */
    private IOException failure(String key, HttpResponse<?> response, String text) {
        return failure(key, response.statusCode(), response.headers().firstValue("x-amz-bucket-region").orElse(null),
                text);
    }

    private IOException failure(String key, int status, String region, String text) {
        Matcher code = XML_CODE.matcher(text);
        Matcher message = XML_MESSAGE.matcher(text);
        String detail = "HTTP " + status + (code.find() ? " " + code.group(1) : "")
                + (message.find() ? ": " + message.group(1) : "");
        if (region != null && !region.equals(s3.region)) {
            detail += " (the bucket is in region " + region + ": give region=" + region + ")";
        }
        String said = "GET " + location.display(key) + " from " + s3 + ": " + detail;
        return status >= 500 ? new IOException(said) : new Refused(said);
    }
}
