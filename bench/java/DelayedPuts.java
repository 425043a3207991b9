import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.net.InetSocketAddress;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.Random;

import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * What a delayed put costs RocketMQ 4.4.0 against a plain one (bench/timer.py, section 4): its own
 * DefaultMessageStore, ASYNC flush, index on (its defaults), one thread. Three kinds of message with a 100-byte body,
 * a tag and a key: "plain"; "delayed", with a DELAY level (the store's putMessage moves it to SCHEDULE_TOPIC_XXXX
 * with REAL_TOPIC and REAL_QID); "sized", a plain record as long as the delayed one (a topic of the same length, the
 * same properties under a name the store does not act on). Each kind is put WARMUP times first (the JIT), then
 * ROUNDS rounds of COUNT puts of each kind in turns; every put is a new message object, as a broker decodes each
 * request into one. Prints one line a kind: its record size, then each round's wall and thread-CPU ns a put.
 *
 *     java -cp ... DelayedPuts DIR SEGMENT_BYTES COUNT ROUNDS WARMUP LEVEL
 */
public final class DelayedPuts {
    private static final String[] KINDS = {"plain", "delayed", "sized"};
    private static final InetSocketAddress HOST = new InetSocketAddress("127.0.0.1", 10911);

    private DelayedPuts() {
    }

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable failure) {  // the store's threads would keep the JVM alive after main died
            failure.printStackTrace();
            Runtime.getRuntime().halt(1);
        }
    }

    private static void run(String[] args) throws Exception {
        String dir = args[0];
        int segmentBytes = Integer.parseInt(args[1]);
        int count = Integer.parseInt(args[2]);
        int rounds = Integer.parseInt(args[3]);
        int warmup = Integer.parseInt(args[4]);
        int level = Integer.parseInt(args[5]);
        MessageStoreConfig config = new MessageStoreConfig();
        config.setStorePathRootDir(dir);
        config.setStorePathCommitLog(dir + "/commitlog");
        config.setMapedFileSizeCommitLog(segmentBytes);  // 4.4.0 spells it so
        config.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        DefaultMessageStore store = new DefaultMessageStore(config, new BrokerStatsManager("bench"),
            (topic, queueId, logicOffset, tagsCode, storeTimestamp, filterBitMap, properties) -> { },
            new BrokerConfig());
        if (!store.load()) {
            throw new IllegalStateException("load() failed on " + dir);
        }
        store.start();
        byte[] body = new byte[100];
        new Random(1).nextBytes(body);
        int[] sizes = new int[KINDS.length];
        for (int kind = 0; kind < KINDS.length; kind++) {
            sizes[kind] = put(store, message(KINDS[kind], body, level));
            for (int i = 1; i < warmup; i++) {
                put(store, message(KINDS[kind], body, level));
            }
        }
        ThreadMXBean threads = ManagementFactory.getThreadMXBean();
        long[][] wall = new long[KINDS.length][rounds];
        long[][] cpu = new long[KINDS.length][rounds];
        for (int round = 0; round < rounds; round++) {
            for (int kind = 0; kind < KINDS.length; kind++) {
                long started = System.nanoTime();
                long startedCpu = threads.getCurrentThreadCpuTime();
                for (int i = 0; i < count; i++) {
                    put(store, message(KINDS[kind], body, level));
                }
                cpu[kind][round] = threads.getCurrentThreadCpuTime() - startedCpu;
                wall[kind][round] = System.nanoTime() - started;
            }
        }
        for (int kind = 0; kind < KINDS.length; kind++) {
            System.out.printf("%s size=%d wall_ns=%s cpu_ns=%s%n", KINDS[kind], sizes[kind],
                perPut(wall[kind], count), perPut(cpu[kind], count));
        }
        System.out.flush();
        Runtime.getRuntime().halt(0);  // the store's threads would keep the JVM; nothing here needs a shutdown
    }

    private static String perPut(long[] totals, int count) {
        double[] each = new double[totals.length];
        for (int i = 0; i < totals.length; i++) {
            each[i] = (double) totals[i] / count;
        }
        return Arrays.toString(each).replace(" ", "");
    }

    private static int put(DefaultMessageStore store, MessageExtBrokerInner message) {
        PutMessageResult result = store.putMessage(message);
        if (!result.isOk()) {
            throw new IllegalStateException("put refused: " + result);
        }
        return result.getAppendMessageResult().getWroteBytes();
    }

    private static MessageExtBrokerInner message(String kind, byte[] body, int level) {
        MessageExtBrokerInner message = new MessageExtBrokerInner();
        message.setBody(body);
        message.setTags("a");
        message.setKeys("k1");
        switch (kind) {
            case "plain":
                message.setTopic("plainly");
                break;
            case "delayed":
                message.setTopic("delayed");
                message.setDelayTimeLevel(level);
                break;
            default:  // what the store makes of "delayed", under names it does not act on
                message.setTopic("SIZED_TOPIC_AS_LONG");
                Map<String, String> more = new HashMap<>();
                more.put("DELAX", Integer.toString(level));
                more.put("REAL_TOPIC", "delayed");
                more.put("REAL_QID", "0");
                for (Map.Entry<String, String> entry : more.entrySet()) {
                    MessageAccessor.putProperty(message, entry.getKey(), entry.getValue());
                }
                break;
        }
        message.setQueueId(0);
        message.setBornTimestamp(System.currentTimeMillis());
        message.setBornHost(HOST);
        message.setStoreHost(HOST);
        message.setPropertiesString(MessageDecoder.messageProperties2String(message.getProperties()));
        message.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(message.getTags()));
        return message;
    }
}
