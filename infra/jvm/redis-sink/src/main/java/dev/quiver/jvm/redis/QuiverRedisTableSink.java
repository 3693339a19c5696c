package dev.quiver.jvm.redis;

import java.util.List;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.sink.DynamicTableSink;
import org.apache.flink.table.connector.sink.SinkV2Provider;
import org.apache.flink.table.types.logical.LogicalType;

/** The `quiver-redis` table: takes the job's updating result as a changelog and keeps its new values. */
final class QuiverRedisTableSink implements DynamicTableSink {
    private final SinkOptions options;
    private final List<String> names;
    private final List<LogicalType> types;
    private final Integer parallelism;

    QuiverRedisTableSink(SinkOptions options, List<String> names, List<LogicalType> types, Integer parallelism) {
        this.options = options;
        this.names = names;
        this.types = types;
        this.parallelism = parallelism;
    }

    @Override
    public ChangelogMode getChangelogMode(ChangelogMode requestedMode) {
        // Every kind, like the debezium-json file sink it replaces (an upsert mode would need a primary key);
        // the writer keeps INSERT and UPDATE_AFTER.
        return ChangelogMode.all();
    }

    @Override
    public SinkRuntimeProvider getSinkRuntimeProvider(Context context) {
        return SinkV2Provider.of(new QuiverRedisSink(options, names, types), parallelism);
    }

    @Override
    public DynamicTableSink copy() {
        return new QuiverRedisTableSink(options, names, types, parallelism);
    }

    @Override
    public String asSummaryString() {
        return "quiver-redis";
    }
}
