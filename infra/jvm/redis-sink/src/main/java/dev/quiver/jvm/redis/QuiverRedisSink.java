package dev.quiver.jvm.redis;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.types.logical.LogicalType;

/** The Sink V2 of one view's `quiver-redis` table: each subtask writes its rows through its own connection. */
public final class QuiverRedisSink implements Sink<RowData> {
    private static final long serialVersionUID = 1L;

    private final SinkOptions options;
    private final List<String> names;
    private final List<LogicalType> types;

    QuiverRedisSink(SinkOptions options, List<String> names, List<LogicalType> types) {
        this.options = options;
        this.names = new ArrayList<>(names);
        this.types = new ArrayList<>(types);
    }

    @Override
    public SinkWriter<RowData> createWriter(WriterInitContext context) throws IOException {
        SinkLayout layout = SinkLayout.parse(options.layoutJson);
        FlushBuffer buffer = new FlushBuffer(layout, new RowEncoder(layout, names, types));
        RedisWriter redis = new RedisWriter(options.redisUrl, options.timeoutMs, layout, options.markersKey);
        QuiverRedisSinkWriter writer = new QuiverRedisSinkWriter(buffer, redis, options.bufferRows,
                options.inFlight, layout.view, context.metricGroup());
        writer.flushEvery(context.getProcessingTimeService(), options.flushIntervalMs);
        return writer;
    }
}
