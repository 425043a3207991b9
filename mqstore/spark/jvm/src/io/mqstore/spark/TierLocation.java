package io.mqstore.spark;

import java.io.ByteArrayOutputStream;
import java.io.Serializable;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * Where a tier lives, parsed from the URI given to load(): the tier's root and how its objects are read. The same
 * URI opens the tier in Python (mqstore/tier/location.py, pyarrow's FileSystem.from_uri):
 *
 * <pre>
 *   URI                                               OBJECTS READ THROUGH
 *   file:///abs/dir                                   java.nio ({@link FileObjects})
 *   s3://[KEY:SECRET@]bucket/prefix[?query]           this reader's S3 client ({@link S3Objects}), path-style URLs
 *   any other scheme (hdfs://, gs://, abfs://, ...)   Hadoop's FileSystem, when Hadoop is on the classpath
 *                                                     (Spark ships it) and knows the scheme ({@link HadoopObjects})
 *   any URI, option tier.io=hadoop                    Hadoop's FileSystem
 * </pre>
 *
 * S3 settings, each from the first place that has it: the URI (user info KEY:SECRET, percent-encoded; query
 * endpoint_override=host:port, scheme=http|https, region=R, as pyarrow spells them), then the reader's options
 * (s3.endpoint, s3.scheme, s3.region, s3.accessKey, s3.secretKey, s3.sessionToken), then the environment
 * (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, AWS_REGION or AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN). They are resolved on the driver and travel with the partitions, so
 * executors need none of them. Without an endpoint the endpoint is AWS's, s3.REGION.amazonaws.com over https;
 * without a region, us-east-1; without keys, requests are sent unsigned (a public bucket).
 *
 * {@link #uri} is the only form of the location that is ever shown: no user info and no query. Objects are named
 * in messages as {@link #display}, as TierLocation.display names them in Python.
 */
final class TierLocation implements Serializable {
    private static final long serialVersionUID = 1L;

    static final String IO_OPTION = "tier.io";
    static final List<String> OPTIONS = List.of(IO_OPTION, "s3.endpoint", "s3.scheme", "s3.region", "s3.accessKey",
            "s3.secretKey", "s3.sessionToken");
    static final String DEFAULT_REGION = "us-east-1";
    static final List<String> S3_QUERY_KEYS = List.of("endpoint_override", "scheme", "region",
            "allow_bucket_creation", "allow_bucket_deletion");  // the last two: accepted as pyarrow does, unused
    private static final Pattern HAS_SCHEME = Pattern.compile("^[A-Za-z][A-Za-z0-9+.-]*://.*", Pattern.DOTALL);

    enum Kind { FILE, S3, HADOOP }

    final Kind kind;
    final String uri;  // shown: scheme://authority-without-user-info/path, no query, no trailing '/'
    final String root;  // FILE: the directory; S3: the key prefix ("" or "a/b"); HADOOP: the URI without query
    final S3Settings s3;  // S3 only
    final Map<String, String> hadoopConf;  // HADOOP only: the session's Hadoop settings that differ from defaults

    private TierLocation(Kind kind, String uri, String root, S3Settings s3, Map<String, String> hadoopConf) {
        this.kind = kind;
        this.uri = uri;
        this.root = root;
        this.s3 = s3;
        this.hadoopConf = hadoopConf;
    }

    /** The settings of S3 requests; toString names the endpoint and the region, never a key. */
    static final class S3Settings implements Serializable {
        private static final long serialVersionUID = 1L;
        final String bucket;
        final String scheme;  // http or https
        final String endpoint;  // host[:port]
        final String region;
        final String accessKey;  // null: unsigned requests
        final String secretKey;
        final String sessionToken;  // or null

        S3Settings(String bucket, String scheme, String endpoint, String region, String accessKey, String secretKey,
                   String sessionToken) {
            this.bucket = bucket;
            this.scheme = scheme;
            this.endpoint = endpoint;
            this.region = region;
            this.accessKey = accessKey;
            this.secretKey = secretKey;
            this.sessionToken = sessionToken;
        }

        @Override
        public String toString() {
            return scheme + "://" + endpoint + " (region " + region + (accessKey == null ? ", unsigned" : "") + ")";
        }
    }

    /** Whether a load() path names a tier (scheme://...) rather than a local store directory. */
    static boolean isUri(String path) {
        return HAS_SCHEME.matcher(path).matches();
    }

    /** The tier `text` names; SourceException (never quoting a secret) when it cannot be read. */
    static TierLocation parse(String text, Map<String, String> options, Map<String, String> environment) {
        int schemeEnd = text.indexOf("://");
        String scheme = text.substring(0, schemeEnd).toLowerCase(Locale.ROOT);
        String rest = text.substring(schemeEnd + 3);
        int queryAt = rest.indexOf('?');
        String query = queryAt < 0 ? "" : rest.substring(queryAt + 1);
        String beforeQuery = queryAt < 0 ? rest : rest.substring(0, queryAt);
        int pathAt = beforeQuery.indexOf('/');
        String authority = pathAt < 0 ? beforeQuery : beforeQuery.substring(0, pathAt);
        String path = pathAt < 0 ? "" : beforeQuery.substring(pathAt);
        int at = authority.lastIndexOf('@');
        String userInfo = at < 0 ? null : authority.substring(0, at);
        String host = authority.substring(at + 1);
        String shown = stripSlashes(scheme + "://" + host + path);
        String io = options.getOrDefault(IO_OPTION, "auto").strip().toLowerCase(Locale.ROOT);
        if (!io.equals("auto") && !io.equals("hadoop")) {
            throw new SourceException("option '" + IO_OPTION + "' must be 'auto' or 'hadoop', got '" + io + "'");
        }
        if (io.equals("hadoop") || (!scheme.equals("file") && !scheme.equals("s3"))) {
            if (!query.isEmpty()) {
                throw new SourceException("the tier " + shown + " is read through Hadoop's FileSystem, which takes no "
                        + "query in the URI: give its settings as spark.hadoop.* settings");
            }
            return new TierLocation(Kind.HADOOP, shown, beforeQuery.isEmpty() ? text : scheme + "://" + beforeQuery,
                    null, HadoopObjects.sessionSettings());
        }
        if (scheme.equals("file")) {
            if (!query.isEmpty() || userInfo != null || !(host.isEmpty() || host.equals("localhost"))) {
                throw new SourceException("a file tier URI is file:///absolute/directory, got " + shown);
            }
            try {
                return new TierLocation(Kind.FILE, shown, Paths.get(new URI("file://" + path)).toString(), null, null);
            } catch (URISyntaxException | IllegalArgumentException e) {
                throw new SourceException("not a file URI of a directory: " + shown + " (" + e.getMessage() + ")");
            }
        }
        if (host.isEmpty()) {
            throw new SourceException("an S3 tier URI names a bucket: s3://bucket/prefix, got " + shown);
        }
        return new TierLocation(Kind.S3, shown, stripSlashes(decode(path, shown)).replaceFirst("^/+", ""),
                s3Settings(host, userInfo, queryItems(query, shown), options, environment, shown), null);
    }

    private static S3Settings s3Settings(String bucket, String userInfo, Map<String, String> query,
                                         Map<String, String> options, Map<String, String> environment,
                                         String shown) {
        String accessKey = null;
        String secretKey = null;
        if (userInfo != null) {
            int colon = userInfo.indexOf(':');
            if (colon < 0) {
                throw new SourceException("the tier URI's user info must be KEY:SECRET (" + shown + ")");
            }
            accessKey = decode(userInfo.substring(0, colon), shown);
            secretKey = decode(userInfo.substring(colon + 1), shown);
        }
        accessKey = first(accessKey, options.get("s3.accessKey"), environment.get("AWS_ACCESS_KEY_ID"));
        secretKey = first(secretKey, options.get("s3.secretKey"), environment.get("AWS_SECRET_ACCESS_KEY"));
        if ((accessKey == null) != (secretKey == null)) {
            throw new SourceException("the tier " + shown + " has an access key without a secret key or the other way "
                    + "round: give both (URI user info, options s3.accessKey and s3.secretKey, or AWS_ACCESS_KEY_ID "
                    + "and AWS_SECRET_ACCESS_KEY)");
        }
        String token = first(null, options.get("s3.sessionToken"), environment.get("AWS_SESSION_TOKEN"));
        String region = first(query.get("region"), options.get("s3.region"), environment.get("AWS_REGION"),
                environment.get("AWS_DEFAULT_REGION"), DEFAULT_REGION);
        String endpoint = first(query.get("endpoint_override"), options.get("s3.endpoint"),
                environment.get("AWS_ENDPOINT_URL_S3"), environment.get("AWS_ENDPOINT_URL"));
        String scheme = first(query.get("scheme"), options.get("s3.scheme"));
        if (endpoint == null) {
            endpoint = "s3." + region + ".amazonaws.com";
        } else if (endpoint.contains("://")) {  // an endpoint URL: its scheme unless one is given
            scheme = first(scheme, endpoint.substring(0, endpoint.indexOf("://")));
            endpoint = endpoint.substring(endpoint.indexOf("://") + 3);
        }
        endpoint = stripSlashes(endpoint);
        scheme = first(scheme, "https").toLowerCase(Locale.ROOT);
        if (!scheme.equals("http") && !scheme.equals("https")) {
            throw new SourceException("the S3 scheme must be http or https, got '" + scheme + "' (" + shown + ")");
        }
        if (endpoint.isEmpty() || endpoint.contains("/") || endpoint.contains("@")) {
            throw new SourceException("the S3 endpoint must be host[:port], got '" + endpoint + "' (" + shown + ")");
        }
        return new S3Settings(bucket, scheme, endpoint, region, accessKey, secretKey, token);
    }

    /** The query's items, refusing those pyarrow's S3 URIs do not have. */
    private static Map<String, String> queryItems(String query, String shown) {
        Map<String, String> items = new LinkedHashMap<>();
        for (String item : query.split("&")) {
            if (item.isEmpty()) {
                continue;
            }
            int eq = item.indexOf('=');
            String key = decode(eq < 0 ? item : item.substring(0, eq), shown);
            if (!S3_QUERY_KEYS.contains(key)) {
                throw new SourceException("unexpected query parameter '" + key + "' in the S3 tier URI " + shown
                        + "; known: " + String.join(", ", S3_QUERY_KEYS));
            }
            items.put(key, decode(eq < 0 ? "" : item.substring(eq + 1), shown));
        }
        return items;
    }

    @SafeVarargs
    private static <T> T first(T... values) {
        for (T value : values) {
            if (value != null && !(value instanceof String && ((String) value).isEmpty())) {
                return value;
            }
        }
        return null;
    }

    private static String stripSlashes(String text) {
        int end = text.length();
        while (end > 0 && text.charAt(end - 1) == '/' && !text.substring(0, end).endsWith("://")) {
            end--;
        }
        return text.substring(0, end);
    }

    /** %XX decoded as UTF-8 ('+' stays '+', as in a URI's user info and path). */
    static String decode(String text, String shown) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(text.length());
        byte[] raw = text.getBytes(StandardCharsets.UTF_8);
        for (int i = 0; i < raw.length; i++) {
            if (raw[i] != '%') {
                out.write(raw[i]);
                continue;
            }
            int hi = i + 2 < raw.length ? Character.digit(raw[i + 1], 16) : -1;
            int lo = i + 2 < raw.length ? Character.digit(raw[i + 2], 16) : -1;
            if (hi < 0 || lo < 0) {
                throw new SourceException("a '%' not followed by two hex digits in the tier URI " + shown);
            }
            out.write(hi * 16 + lo);
            i += 2;
        }
        return out.toString(StandardCharsets.UTF_8);
    }

    /** How the object `key` (relative to the tier's root, with '/') is named in messages and errors. */
    String display(String key) {
        return uri + "/" + key;
    }

    /** A reader of the tier's objects, for this thread's reads (close it after). */
    TierObjects open() {
        switch (kind) {
            case FILE:
                return new FileObjects(this);
            case S3:
                return new S3Objects(this);
            default:
                return HadoopObjects.open(this);
        }
    }
}
