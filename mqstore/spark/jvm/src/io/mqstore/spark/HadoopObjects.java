package io.mqstore.spark;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import java.util.Objects;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkContext;

/**
 * The objects of a tier whose scheme this reader has no client of its own for (hdfs://, gs://, abfs://, ... or
 * any URI with the option tier.io=hadoop), read through Hadoop's FileSystem API, which Spark ships
 * (hadoop-client-api): `Path#getFileSystem` with the SparkContext's Hadoop settings (spark.hadoop.*, the
 * cluster's *-site.xml), a range being a positioned readFully of the object's stream, the stream of the last
 * object read kept open. A scheme Hadoop has no FileSystem for (gs:// without the GCS connector's jar) is refused
 * at planning, naming the scheme. The settings are taken on the driver (those that differ from Hadoop's
 * defaults) and travel with the partitions.
 */
final class HadoopObjects {
    private HadoopObjects() {
    }

    /** The SparkContext's Hadoop settings that differ from a new Configuration's (empty without Hadoop). */
    static Map<String, String> sessionSettings() {
        try {
            Configuration session = SparkContext.getOrCreate().hadoopConfiguration();
            Configuration defaults = new Configuration();
            Map<String, String> differing = new HashMap<>();
            for (Map.Entry<String, String> entry : session) {
                if (!Objects.equals(defaults.getRaw(entry.getKey()), entry.getValue())) {
                    differing.put(entry.getKey(), entry.getValue());
                }
            }
            return differing;
        } catch (LinkageError | Exception e) {
            return new HashMap<>();  // no Hadoop or no SparkContext here: open() says what is missing
        }
    }

    /** A reader of the tier's objects through Hadoop; SourceException when Hadoop cannot open its scheme. */
    static TierObjects open(TierLocation location) {
        try {
            return new Reader(location);
        } catch (LinkageError e) {
            throw new SourceException("the tier " + location.uri + " needs Hadoop's FileSystem API, which is not on "
                    + "the classpath (" + e + "); file:// and s3:// tiers are read without it");
        } catch (IOException | RuntimeException e) {  // no FileSystem for the scheme, or its class is missing
            throw new SourceException("Hadoop's FileSystem cannot open the tier " + location.uri + ": " + e.getMessage()
                    + " (a scheme without a FileSystem needs its connector's jar on spark.jars)");
        }
    }

    static final class Reader implements TierObjects {
        private final TierLocation location;
        private final FileSystem filesystem;
        private final Path root;
        private String openKey;
        private FSDataInputStream stream;

        Reader(TierLocation location) throws IOException {
            this.location = location;
            Configuration conf = new Configuration();
            location.hadoopConf.forEach(conf::set);
            this.root = new Path(location.root);
            this.filesystem = root.getFileSystem(conf);  // cached and shared by Hadoop: never closed here
        }

        @Override
        public byte[] readAll(String key, int bytesMax) throws IOException {
            Path path = new Path(root, key);
            try (FSDataInputStream in = filesystem.open(path)) {
                long length = filesystem.getFileStatus(path).getLen();
                if (length > bytesMax) {
                    throw new IOException(location.display(key) + " is " + length + " bytes, more than " + bytesMax);
                }
                byte[] data = new byte[(int) length];
                in.readFully(0, data, 0, data.length);
                return data;
            } catch (FileNotFoundException e) {
                return null;
            }
        }

        @Override
        public void readRange(String key, long offset, byte[] into, int at, int count) throws IOException {
            if (!key.equals(openKey)) {
                close();
                try {
                    stream = filesystem.open(new Path(root, key));
                } catch (FileNotFoundException e) {
                    throw TierObjects.missing(location, key, offset);
                }
                openKey = key;
            }
            try {
                stream.readFully(offset, into, at, count);
            } catch (EOFException e) {
                throw TierObjects.shorter(location, key, offset, Math.addExact(offset, count));
            }
        }

        @Override
        public void close() throws IOException {
            if (stream != null) {
                stream.close();
                stream = null;
                openKey = null;
            }
        }
    }
}
