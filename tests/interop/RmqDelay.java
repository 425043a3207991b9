// RocketMQ 4.4.0's DefaultMessageStore with delay levels, for tests/interop/test_schedule_interop.py.
//   RmqDelay put   STORE SEG_BYTES CQ_ENTRIES N LEVEL...  N putMessage calls with DELAY = LEVEL[i % count] (4.4.0's
//                                                       CommitLog moves them to SCHEDULE_TOPIC_XXXX), then shutdown;
//                                                       prints "ACK i level commitlog_offset store_timestamp_ms"
//   RmqDelay units STORE SEG_BYTES CQ_ENTRIES            load (recover) and print every SCHEDULE_TOPIC_XXXX unit:
//                                                       "UNIT queue_id queue_offset commitlog_offset size tags_code"
//   RmqDelay run   STORE SEG_BYTES CQ_ENTRIES MS         load, start (its ScheduleMessageService delivers what is
//                                                       due), wait MS milliseconds, shutdown
// Compiled on first use against ../shared/rocketmq-4.4.0/lib by tests/interop/rmq_delay.py.
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.store.*;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.schedule.ScheduleMessageService;
import org.apache.rocketmq.store.stats.BrokerStatsManager;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;

public class RmqDelay {
    static DefaultMessageStore open(String dir, int seg, int cqEntries) throws Exception {
        MessageStoreConfig c = new MessageStoreConfig();
        c.setStorePathRootDir(dir);
        c.setStorePathCommitLog(dir + "/commitlog");
        c.setMapedFileSizeCommitLog(seg);
        c.setMapedFileSizeConsumeQueue(cqEntries * 20);
        c.setMessageIndexEnable(false);
        DefaultMessageStore s = new DefaultMessageStore(c, new BrokerStatsManager("c"),
                (tp, q, lo, tc, st, fb, pr) -> {}, new BrokerConfig());
        if (!s.load()) throw new RuntimeException("load failed");
        s.start();
        return s;
    }

    public static void main(String[] a) throws Exception {
        String mode = a[0], dir = a[1];
        DefaultMessageStore s = open(dir, Integer.parseInt(a[2]), Integer.parseInt(a[3]));
        if (mode.equals("put")) {
            int n = Integer.parseInt(a[4]);
            InetSocketAddress host = new InetSocketAddress(InetAddress.getByName("127.0.0.1"), 10911);
            for (int i = 0; i < n; i++) {
                int level = Integer.parseInt(a[5 + i % (a.length - 5)]);
                MessageExtBrokerInner m = new MessageExtBrokerInner();
                m.setTopic("delayed");
                m.setQueueId(i % 4);
                m.setTags("TagD");
                m.setKeys("key-" + i);
                m.setBody(("d-" + i).getBytes("UTF-8"));
                m.putUserProperty("u", "v" + i);
                m.setDelayTimeLevel(level);
                m.setBornTimestamp(System.currentTimeMillis());
                m.setBornHost(host);
                m.setStoreHost(host);
                m.setPropertiesString(MessageDecoder.messageProperties2String(m.getProperties()));
                m.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(m.getTags()));
                PutMessageResult r = s.putMessage(m);
                if (!r.isOk()) throw new RuntimeException("put failed " + r);
                System.out.printf("ACK %d %d %d %d%n", i, level, r.getAppendMessageResult().getWroteOffset(),
                        r.getAppendMessageResult().getStoreTimestamp());
            }
            for (int w = 0; w < 500 && s.dispatchBehindBytes() > 0; w++) Thread.sleep(10);
        } else if (mode.equals("run")) {
            Thread.sleep(Long.parseLong(a[4]));
            for (int w = 0; w < 500 && s.dispatchBehindBytes() > 0; w++) Thread.sleep(10);
        } else {
            String topic = ScheduleMessageService.SCHEDULE_TOPIC;
            for (int q = 0; q < 18; q++) {
                ConsumeQueue cq = s.findConsumeQueue(topic, q);
                for (long o = cq.getMinOffsetInQueue(); o < cq.getMaxOffsetInQueue(); o++) {
                    SelectMappedBufferResult r = cq.getIndexBuffer(o);
                    ByteBuffer b = r.getByteBuffer();
                    System.out.printf("UNIT %d %d %d %d %d%n", q, o, b.getLong(), b.getInt(), b.getLong());
                    r.release();
                }
            }
        }
        s.shutdown();
        System.exit(0);
    }
}
