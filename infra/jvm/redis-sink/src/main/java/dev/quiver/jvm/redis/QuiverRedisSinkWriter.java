package dev.quiver.jvm.redis;

import java.io.IOException;
import org.apache.flink.api.common.operators.ProcessingTimeService;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.table.data.RowData;
import org.apache.flink.types.RowKind;

/**
 * Buffers the new values (INSERT / UPDATE_AFTER; the value an UPDATE_BEFORE or DELETE retracts is superseded
 * by the next new value, as the loader keeps only debezium "c" rows) and sends them when {@code buffer.rows} rows
 * wait and on {@link #flush}, which Flink calls before each checkpoint barrier and at end of input. Sends go to
 * the writer thread ({@link BackgroundWrites}; {@code write.in-flight} = 0: written in the task thread), and
 * {@link #flush} waits until all of them are in Redis, so a checkpoint completes only after its rows are:
 * replays after a failure write the same values again, which the newer-wins / fuller-tile scripts make harmless
 * (at least once, exactly-once effect).
 * With a flush interval the writer also writes on a processing-time timer (in the task's mailbox, like every
 * other call here): values are readable that soon after their event, not only at the next checkpoint. A
 * write between checkpoints is as safe as the full-buffer one: replays only ever rewrite the same values.
 */
final class QuiverRedisSinkWriter implements SinkWriter<RowData> {
    private final FlushBuffer buffer;
    private final RedisWriter redis;
    private final BackgroundWrites background; // null: write in the task thread
    private final int bufferRows;
    private final Counter keysWritten;
    private final Counter rowsDropped;
    private final Counter markers;

    QuiverRedisSinkWriter(FlushBuffer buffer, RedisWriter redis, int bufferRows, int inFlight, String view,
            MetricGroup metrics) {
        this.buffer = buffer;
        this.redis = redis;
        this.background = inFlight > 0 ? new BackgroundWrites(redis, inFlight, view, this::count) : null;
        this.bufferRows = bufferRows;
        this.keysWritten = metrics.counter("quiverKeysWritten");
        this.rowsDropped = metrics.counter("quiverNullKeyRowsDropped");
        this.markers = metrics.counter("quiverBatchMarkers");
    }

    @Override
    public void write(RowData row, Context context) throws IOException {
        RowKind kind = row.getRowKind();
        if (kind != RowKind.INSERT && kind != RowKind.UPDATE_AFTER) {
            return;
        }
        buffer.add(row);
        if (buffer.rows() >= bufferRows) {
            send();
        }
    }

    /** Also write every `intervalMs` (0: never on a timer). */
    void flushEvery(ProcessingTimeService timers, long intervalMs) {
        if (intervalMs > 0) {
            schedule(timers, intervalMs);
        }
    }

    private void schedule(ProcessingTimeService timers, long intervalMs) {
        timers.registerTimer(timers.getCurrentProcessingTime() + intervalMs, now -> {
            send();
            schedule(timers, intervalMs);
        });
    }

    @Override
    public void flush(boolean endOfInput) throws IOException {
        send();
        if (background != null) {
            background.awaitAll();
        }
    }

    private void send() throws IOException {
        if (buffer.rows() == 0) {
            return;
        }
        FlushBuffer.Flush flush = buffer.drain();
        if (background != null) {
            background.submit(flush);
        } else {
            redis.write(flush);
            count(flush);
        }
    }

    private void count(FlushBuffer.Flush flush) {
        keysWritten.inc(flush.keys.size());
        rowsDropped.inc(flush.dropped);
        markers.inc(flush.markers.size());
    }

    @Override
    public void close() {
        if (background != null) {
            background.close(); // closes the connection too, once its thread is done with it
        } else {
            redis.close();
        }
    }
}
