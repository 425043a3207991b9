package io.mqstore.spark;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * AWS Signature Version 4 for the tier's S3 reads ({@link S3Objects}): the Authorization header of a request, as
 * AWS documents it (docs.aws.amazon.com, "Signature Version 4 signing process"):
 *
 * <pre>
 *   canonical request  METHOD \n canonical URI \n canonical query \n
 *                      lower(name):trimmed value \n  (one line a signed header, sorted by name) \n
 *                      signed header names joined by ';' \n payload hash (hex SHA-256)
 *   string to sign     "AWS4-HMAC-SHA256" \n amz-date \n date/region/service/aws4_request \n hex SHA-256(canonical)
 *   signing key        HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request")
 *   header             AWS4-HMAC-SHA256 Credential=KEY/date/region/service/aws4_request,
 *                      SignedHeaders=a;b;c, Signature=hex HMAC-SHA256(signing key, string to sign)
 * </pre>
 *
 * Every header given is signed; the S3 reader signs host, range, x-amz-content-sha256 (the empty payload's hash),
 * x-amz-date and x-amz-security-token when there is a session token. Public so that the tests can sign AWS's
 * published test vectors and the requests botocore signs through the session's JVM (tests/spark/test_tier_jvm.py).
 * Nothing here logs or keeps a secret.
 */
public final class SigV4 {
    private SigV4() {
    }

    public static final String ALGORITHM = "AWS4-HMAC-SHA256";
    public static final String EMPTY_PAYLOAD_SHA256 =
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    private static final DateTimeFormatter AMZ_DATE = DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'", Locale.ROOT);
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    static {
        if (!sha256Hex(new byte[0]).equals(EMPTY_PAYLOAD_SHA256)) {
            throw new AssertionError("SHA-256 of nothing is not the constant");
        }
    }

    /** The x-amz-date of now: yyyyMMdd'T'HHmmss'Z' in UTC. */
    static String amzDate(ZonedDateTime now) {
        return AMZ_DATE.format(now.withZoneSameInstant(ZoneOffset.UTC));
    }

    /**
     * The Authorization header of a request. `canonicalUri` is the path already URI-encoded as sent (S3: each key
     * segment encoded once, {@link #uriEncode}); `canonicalQuery` the sorted, encoded query ("" for none);
     * `headers` every header to sign (names in any case; `x-amz-date` among them, whose value dates the
     * signature).
     */
    public static String authorization(String method, String canonicalUri, String canonicalQuery,
                                       Map<String, String> headers, String payloadHash, String accessKey,
                                       String secretKey, String region, String service) {
        TreeMap<String, String> signed = new TreeMap<>();
        for (Map.Entry<String, String> header : headers.entrySet()) {
            signed.put(header.getKey().toLowerCase(Locale.ROOT), header.getValue().strip().replaceAll(" +", " "));
        }
        String amzDate = signed.get("x-amz-date");
        if (amzDate == null || amzDate.length() != 16) {
            throw new IllegalArgumentException("a signed request needs an x-amz-date header (yyyyMMddTHHmmssZ)");
        }
        StringBuilder canonical = new StringBuilder(method).append('\n').append(canonicalUri).append('\n')
                .append(canonicalQuery).append('\n');
        for (Map.Entry<String, String> header : signed.entrySet()) {
            canonical.append(header.getKey()).append(':').append(header.getValue()).append('\n');
        }
        String names = String.join(";", signed.keySet());
        canonical.append('\n').append(names).append('\n').append(payloadHash);
        String date = amzDate.substring(0, 8);
        String scope = date + "/" + region + "/" + service + "/aws4_request";
        String toSign = ALGORITHM + "\n" + amzDate + "\n" + scope + "\n"
                + sha256Hex(canonical.toString().getBytes(StandardCharsets.UTF_8));
        byte[] key = hmac(("AWS4" + secretKey).getBytes(StandardCharsets.UTF_8), date);
        key = hmac(hmac(hmac(key, region), service), "aws4_request");
        return ALGORITHM + " Credential=" + accessKey + "/" + scope + ", SignedHeaders=" + names + ", Signature="
                + hex(hmac(key, toSign));
    }

    /**
     * RFC 3986 percent-encoding as SigV4 wants it: A-Z a-z 0-9 - . _ ~ kept, every other UTF-8 byte as %XX
     * (upper-case hex); '/' kept when `keepSlash` (an S3 key in a path).
     */
    public static String uriEncode(String text, boolean keepSlash) {
        StringBuilder out = new StringBuilder(text.length() + 16);
        for (byte b : text.getBytes(StandardCharsets.UTF_8)) {
            int c = b & 0xFF;
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'
                    || c == '_' || c == '~' || (keepSlash && c == '/')) {
                out.append((char) c);
            } else {
                out.append('%').append(Character.toUpperCase(HEX[c >>> 4])).append(Character.toUpperCase(HEX[c & 15]));
            }
        }
        return out.toString();
    }

    static String sha256Hex(byte[] data) {
        try {
            return hex(MessageDigest.getInstance("SHA-256").digest(data));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every Java has SHA-256", e);
        }
    }

    private static byte[] hmac(byte[] key, String data) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            return mac.doFinal(data.getBytes(StandardCharsets.UTF_8));
        } catch (java.security.GeneralSecurityException e) {
            throw new IllegalStateException("every Java has HmacSHA256", e);
        }
    }

    private static String hex(byte[] bytes) {
        char[] out = new char[2 * bytes.length];
        for (int i = 0; i < bytes.length; i++) {
            out[2 * i] = HEX[(bytes[i] >>> 4) & 15];
            out[2 * i + 1] = HEX[bytes[i] & 15];
        }
        return new String(out);
    }
}
