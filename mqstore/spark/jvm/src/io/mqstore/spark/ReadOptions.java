package io.mqstore.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.nio.file.DirectoryStream;
import java.nio.file.FileSystems;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.PathMatcher;
import java.nio.file.Paths;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeParseException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * The options of one load(), checked as mqstore/store/scan_options.py checks them (same names, same meaning,
 * same messages), the streaming ones included.
 */
final class ReadOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    static final String NAME = "commitlog";
    static final List<String> KNOWN = known();

    private static List<String> known() {
        List<String> names = new ArrayList<>(List.of("topic", "queue_id", "start_offset", "end_offset", "start_time",
                "end_time", "maxBytesPerTrigger", "maxRecordsPerTrigger", "startingOffsets"));
        names.addAll(TierLocation.OPTIONS);  // where a tier's objects are read from (TierLocation)
        return List.copyOf(names);
    }

    /**
     * One store to read: its absolute root (for a tier: its shown URI, without user info or query) and the label
     * of its `store` column (null without the column); `tier` says where a tier's objects are, null for a local
     * store.
     */
    static final class StoreRef implements Serializable {
        private static final long serialVersionUID = 1L;
        final String root;
        final String label;
        final TierLocation tier;

        StoreRef(String root, String label) {
            this(root, label, null);
        }

        StoreRef(String root, String label, TierLocation tier) {
            this.root = root;
            this.label = label;
            this.tier = tier;
        }
    }

    final List<StoreRef> stores;
    final boolean withStoreColumn;
    final RowFilter filter;
    final Long maxBytesPerTrigger;  // streaming: null when not set
    final Long maxRecordsPerTrigger;
    final boolean startLatest;  // startingOffsets=latest

    private ReadOptions(List<StoreRef> stores, boolean withStoreColumn, RowFilter filter, Long maxBytesPerTrigger,
                        Long maxRecordsPerTrigger, boolean startLatest) {
        this.stores = stores;
        this.withStoreColumn = withStoreColumn;
        this.filter = filter;
        this.maxBytesPerTrigger = maxBytesPerTrigger;
        this.maxRecordsPerTrigger = maxRecordsPerTrigger;
        this.startLatest = startLatest;
    }

    static ReadOptions parse(Map<String, String> options) {
        Map<String, String> values = new java.util.HashMap<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            String key = e.getKey().toLowerCase(Locale.ROOT);
            if (key.equals("path") || key.equals("paths")) {
                values.put(key, e.getValue());
                continue;
            }
            String known = null;
            for (String name : KNOWN) {
                if (name.toLowerCase(Locale.ROOT).equals(key)) {
                    known = name;
                }
            }
            if (known == null) {
                throw new SourceException("unknown option '" + e.getKey() + "' for the " + NAME + " source; known "
                        + "options: " + String.join(", ", KNOWN));
            }
            values.put(known, e.getValue());
        }
        List<StoreRef> stores = new ArrayList<>();
        boolean several = resolvePaths(values, stores);
        RowFilter filter = new RowFilter(
                nameSet(values, "topic"), intSet(values, "queue_id"),
                longOption(values, "start_offset", 0), longOption(values, "end_offset", 0),
                timeOption(values, "start_time"), timeOption(values, "end_time"));
        String starting = values.getOrDefault("startingOffsets", "earliest").strip().toLowerCase(Locale.ROOT);
        if (!starting.equals("earliest") && !starting.equals("latest")) {
            throw new SourceException("option 'startingOffsets' must be 'earliest' or 'latest', got '" + starting
                    + "'");
        }
        return new ReadOptions(stores, several, filter, longOption(values, "maxBytesPerTrigger", 1),
                longOption(values, "maxRecordsPerTrigger", 1), starting.equals("latest"));
    }

    // --- paths ------------------------------------------------------------------------------------------------
    private static boolean resolvePaths(Map<String, String> values, List<StoreRef> stores) {
        List<String> given = new ArrayList<>();
        if (values.containsKey("paths")) {
            if (values.containsKey("path")) {
                given.add(values.get("path"));
            }
            try {
                JsonNode node = new ObjectMapper().readTree(values.get("paths"));
                if (node == null || !node.isArray()) {
                    throw new SourceException("option 'paths' is not a JSON list: " + values.get("paths"));
                }
                for (JsonNode item : node) {
                    if (!item.isTextual()) {
                        throw new SourceException("option 'paths' is not a JSON list of strings: " + values.get("paths"));
                    }
                    given.add(item.asText());
                }
            } catch (IOException e) {
                throw new SourceException("option 'paths' is not a JSON list: " + values.get("paths"));
            }
        } else if (values.containsKey("path")) {
            given.add(values.get("path"));
        } else {
            throw new SourceException("no store path: use spark.read.format(\"" + NAME + "\").load('/path/to/store')");
        }
        if (given.isEmpty()) {
            throw new SourceException("no store path: the list of paths is empty");
        }
        boolean several = given.size() > 1
                || given.stream().anyMatch(path -> !TierLocation.isUri(path) && hasMagic(path));
        Set<String> seen = new HashSet<>();
        for (String pattern : given) {
            if (TierLocation.isUri(pattern)) {  // a tier: read from its objects, as listed by its manifest
                TierLocation tier = TierLocation.parse(pattern, values, System.getenv());
                if (seen.add(tier.uri)) {
                    stores.add(new StoreRef(tier.uri, several ? tier.uri : null, tier));
                }
                continue;
            }
            List<String> matches = hasMagic(pattern) ? glob(pattern) : List.of(pattern);
            if (matches.isEmpty()) {
                throw new SourceException("no store matches the path pattern '" + pattern + "'");
            }
            for (String match : matches) {
                Path root = Paths.get(match).toAbsolutePath().normalize();
                if (!Files.exists(root)) {
                    throw new SourceException("store path does not exist: " + match);
                }
                if (!Files.isDirectory(root)) {
                    throw new SourceException("store path is not a directory: " + match);
                }
                if (!Files.isDirectory(root.resolve("commitlog"))) {
                    throw new SourceException("not a RocketMQ store (no commitlog/ directory): " + match);
                }
                String real;
                try {
                    real = root.toRealPath().toString();
                } catch (IOException e) {
                    real = root.toString();
                }
                if (seen.add(real)) {
                    stores.add(new StoreRef(root.toString(), several ? root.toString() : null));
                }
            }
        }
        return several;
    }

    static boolean hasMagic(String pattern) {
        return pattern.indexOf('*') >= 0 || pattern.indexOf('?') >= 0 || pattern.indexOf('[') >= 0;
    }

    /**
     * Python's glob.glob, sorted: each path component with a wildcard is matched against a directory's
     * entries (names starting with '.' only by a component starting with '.').
     */
    static List<String> glob(String pattern) {
        boolean absolute = pattern.startsWith("/");
        List<String> found = new ArrayList<>(List.of(absolute ? "/" : ""));
        for (String part : pattern.split("/")) {
            if (part.isEmpty()) {
                continue;
            }
            List<String> next = new ArrayList<>();
            for (String dir : found) {
                if (!hasMagic(part)) {
                    String candidate = dir.isEmpty() ? part : dir.endsWith("/") ? dir + part : dir + "/" + part;
                    if (Files.exists(Paths.get(candidate.isEmpty() ? "." : candidate))) {
                        next.add(candidate);
                    }
                    continue;
                }
                PathMatcher matcher = FileSystems.getDefault().getPathMatcher("glob:" + part);
                Path directory = Paths.get(dir.isEmpty() ? "." : dir);
                if (!Files.isDirectory(directory)) {
                    continue;
                }
                TreeSet<String> names = new TreeSet<>();
                try (DirectoryStream<Path> entries = Files.newDirectoryStream(directory)) {
                    for (Path entry : entries) {
                        String name = entry.getFileName().toString();
                        if (name.startsWith(".") && !part.startsWith(".")) {
                            continue;
                        }
                        if (matcher.matches(Paths.get(name))) {
                            names.add(name);
                        }
                    }
                } catch (IOException e) {
                    continue;
                }
                for (String name : names) {
                    next.add(dir.isEmpty() ? name : dir.endsWith("/") ? dir + name : dir + "/" + name);
                }
            }
            found = next;
        }
        List<String> result = new ArrayList<>(found);
        result.removeIf(String::isEmpty);
        result.sort(null);
        return result;
    }

    // --- values -----------------------------------------------------------------------------------------------
    private static Set<String> nameSet(Map<String, String> values, String name) {
        if (!values.containsKey(name)) {
            return null;
        }
        Set<String> names = new LinkedHashSet<>();
        for (String part : values.get(name).split(",", -1)) {
            String trimmed = part.strip();
            if (trimmed.isEmpty()) {
                throw new SourceException("option '" + name + "' has an empty name: '" + values.get(name) + "'");
            }
            names.add(trimmed);
        }
        return names;
    }

    private static Set<Integer> intSet(Map<String, String> values, String name) {
        if (!values.containsKey(name)) {
            return null;
        }
        Set<Integer> ids = new LinkedHashSet<>();
        for (String part : values.get(name).split(",", -1)) {
            long id;
            try {
                id = Long.parseLong(part.strip());
            } catch (NumberFormatException e) {
                throw new SourceException("option '" + name + "' must be integers separated by commas, got '"
                        + values.get(name) + "'");
            }
            if (id < 0) {
                throw new SourceException("option '" + name + "' must not be negative, got '" + values.get(name) + "'");
            }
            if (id <= Integer.MAX_VALUE) {
                ids.add((int) id);  // a larger id matches no record: QUEUEID is an i32
            }
        }
        return ids;
    }

    private static Long longOption(Map<String, String> values, String name, long minimum) {
        if (!values.containsKey(name)) {
            return null;
        }
        long value;
        try {
            value = Long.parseLong(values.get(name).strip());
        } catch (NumberFormatException e) {
            throw new SourceException("option '" + name + "' must be an integer, got '" + values.get(name) + "'");
        }
        if (value < minimum) {
            throw new SourceException("option '" + name + "' must be >= " + minimum + ", got " + value);
        }
        return value;
    }

    /** Milliseconds since the epoch or an ISO-8601 timestamp (naive means UTC), as microseconds. */
    private static Long timeOption(Map<String, String> values, String name) {
        if (!values.containsKey(name)) {
            return null;
        }
        String text = values.get(name).strip();
        try {
            return Math.multiplyExact(Long.parseLong(text), 1000L);
        } catch (NumberFormatException | ArithmeticException e) {
            // not milliseconds: an ISO-8601 date or date-time
        }
        String iso = text.length() > 10 && text.charAt(10) == ' ' ? text.substring(0, 10) + "T" + text.substring(11)
                : text;
        try {
            if (iso.length() == 10) {
                return LocalDate.parse(iso).atStartOfDay().toEpochSecond(ZoneOffset.UTC) * 1_000_000L;
            }
            try {
                return micros(LocalDateTime.parse(iso).toInstant(ZoneOffset.UTC));
            } catch (DateTimeParseException e) {
                return micros(OffsetDateTime.parse(iso).toInstant());
            }
        } catch (DateTimeParseException e) {
            throw new SourceException("option '" + name + "' must be milliseconds since the epoch or an ISO-8601 "
                    + "timestamp, got '" + text + "'");
        }
    }

    static long micros(java.time.Instant instant) {
        return Math.addExact(Math.multiplyExact(instant.getEpochSecond(), 1_000_000L), instant.getNano() / 1000);
    }

    static String describe(Set<?> set) {
        return set == null ? "any" : Arrays.toString(set.toArray());
    }
}
