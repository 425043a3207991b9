package io.mqstore.spark;

import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** The source's schema: mqstore/store/scan_options.py's commitlog_schema(), column for column. */
final class Columns {
    private Columns() {
    }

    static final int TOPIC = 0;
    static final int QUEUE_ID = 1;
    static final int QUEUE_OFFSET = 2;
    static final int COMMITLOG_OFFSET = 3;
    static final int BODY = 4;
    static final int TAGS = 5;
    static final int KEYS = 6;
    static final int PROPERTIES = 7;
    static final int FLAG = 8;
    static final int SYS_FLAG = 9;
    static final int BORN_TIMESTAMP = 10;
    static final int STORE_TIMESTAMP = 11;
    static final int BORN_HOST = 12;
    static final int STORE_HOST = 13;
    static final int RECONSUME_TIMES = 14;
    static final int BODY_CRC = 15;
    static final int MSG_ID = 16;
    static final int STORE = 17;
    static final int COUNT = 18;

    static final StructField[] FIELDS = {
        DataTypes.createStructField("topic", DataTypes.StringType, false),
        DataTypes.createStructField("queue_id", DataTypes.IntegerType, false),
        DataTypes.createStructField("queue_offset", DataTypes.LongType, false),
        DataTypes.createStructField("commitlog_offset", DataTypes.LongType, false),
        DataTypes.createStructField("body", DataTypes.BinaryType, false),
        DataTypes.createStructField("tags", DataTypes.StringType, true),
        DataTypes.createStructField("keys", DataTypes.createArrayType(DataTypes.StringType, false), false),
        DataTypes.createStructField("properties",
                DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, false), false),
        DataTypes.createStructField("flag", DataTypes.IntegerType, false),
        DataTypes.createStructField("sys_flag", DataTypes.IntegerType, false),
        DataTypes.createStructField("born_timestamp", DataTypes.TimestampType, false),
        DataTypes.createStructField("store_timestamp", DataTypes.TimestampType, false),
        DataTypes.createStructField("born_host", DataTypes.StringType, false),
        DataTypes.createStructField("store_host", DataTypes.StringType, false),
        DataTypes.createStructField("reconsume_times", DataTypes.IntegerType, false),
        DataTypes.createStructField("body_crc", DataTypes.IntegerType, false),
        DataTypes.createStructField("msg_id", DataTypes.StringType, false),
        DataTypes.createStructField("store", DataTypes.StringType, false),
    };

    static StructType schema(boolean withStoreColumn) {
        StructField[] fields = new StructField[withStoreColumn ? COUNT : COUNT - 1];
        System.arraycopy(FIELDS, 0, fields, 0, fields.length);
        return new StructType(fields);
    }

    /** The column ids of `schema`'s fields, in its order. */
    static int[] ids(StructType schema) {
        int[] ids = new int[schema.fields().length];
        for (int i = 0; i < ids.length; i++) {
            ids[i] = -1;
            for (int c = 0; c < COUNT; c++) {
                if (FIELDS[c].name().equals(schema.fields()[i].name())) {
                    ids[i] = c;
                }
            }
            if (ids[i] < 0) {
                throw new SourceException("no column " + schema.fields()[i].name() + " in the " + ReadOptions.NAME
                        + " source");
            }
        }
        return ids;
    }
}
