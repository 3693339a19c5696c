package dev.quiver.jvm.redis;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.Set;
import java.util.TreeMap;
import org.apache.flink.table.data.RowData;

/**
 * The rows of one flush, reduced the way the Python loader and store reduce a batch before its scripts run: last
 * values keep the newest row per entity (ties by the offline rule, later row on a full tie), tiles keep the fullest
 * row per (entity, tile_start) (later row on a tie), sorted by tile_start and trimmed to the trim horizon.
 */
final class FlushBuffer {
    /** What one flush sends: one value per key, then freshness and markers. */
    static final class Flush {
        final List<byte[]> keys = new ArrayList<>();
        final List<byte[]> values = new ArrayList<>();
        final Set<String> markers;
        final Long maxEventTs; // null: no feature row
        final long dropped;
        final long rows;

        Flush(Set<String> markers, Long maxEventTs, long dropped, long rows) {
            this.markers = markers;
            this.maxEventTs = maxEventTs;
            this.dropped = dropped;
            this.rows = rows;
        }

        boolean isEmpty() {
            return keys.isEmpty() && markers.isEmpty();
        }
    }

    private final SinkLayout layout;
    private final RowEncoder encoder;
    private final Map<ByteBuffer, RowEncoder.Encoded> last = new HashMap<>();
    private final Map<ByteBuffer, NavigableMap<Long, RowEncoder.Encoded>> tiles = new HashMap<>();
    private Set<String> markers = new LinkedHashSet<>();
    private Long maxEventTs;
    private long dropped;
    private long rows;

    FlushBuffer(SinkLayout layout, RowEncoder encoder) {
        this.layout = layout;
        this.encoder = encoder;
    }

    /** Rows added since the last drain (markers and dropped rows included). */
    long rows() {
        return rows;
    }

    /** Add one new value (INSERT / UPDATE_AFTER row). */
    void add(RowData row) {
        rows++;
        String marker = encoder.marker(row);
        if (marker != null) { // the loader records it and never writes the row
            markers.add(marker);
            return;
        }
        if (!encoder.complete(row)) { // a null-key group of the job (the feeder counted it) or no time
            dropped++;
            return;
        }
        RowEncoder.Encoded e = encoder.encode(row);
        maxEventTs = maxEventTs == null ? e.newest : Math.max(maxEventTs, e.newest);
        ByteBuffer key = ByteBuffer.wrap(e.key);
        if (layout.isTiles()) {
            NavigableMap<Long, RowEncoder.Encoded> byStart = tiles.computeIfAbsent(key, k -> new TreeMap<>());
            RowEncoder.Encoded old = byStart.get(e.time);
            if (old == null || e.events >= old.events) {
                byStart.put(e.time, e);
            }
        } else {
            RowEncoder.Encoded old = last.get(key);
            if (old == null || e.time > old.time
                    || (e.time == old.time && RowEncoder.compareOrder(e.order, old.order) >= 0)) {
                last.put(key, e);
            }
        }
    }

    /** Everything buffered, reduced to one value per key; the buffer starts empty again. */
    Flush drain() {
        Flush flush = new Flush(markers, maxEventTs, dropped, rows);
        if (layout.isTiles()) {
            for (Map.Entry<ByteBuffer, NavigableMap<Long, RowEncoder.Encoded>> entry : tiles.entrySet()) {
                NavigableMap<Long, RowEncoder.Encoded> byStart = entry.getValue();
                // Older than the entity's newest tile minus the horizon: never read again (codec.TileCodec.encode).
                NavigableMap<Long, RowEncoder.Encoded> kept =
                        byStart.tailMap(byStart.lastKey() - layout.trimHorizonUs, true);
                int size = 0;
                for (RowEncoder.Encoded e : kept.values()) {
                    size += e.record.length;
                }
                ByteBuffer value = ByteBuffer.allocate(size);
                for (RowEncoder.Encoded e : kept.values()) {
                    value.put(e.record);
                }
                flush.keys.add(entry.getKey().array());
                flush.values.add(value.array());
            }
        } else {
            for (Map.Entry<ByteBuffer, RowEncoder.Encoded> entry : last.entrySet()) {
                flush.keys.add(entry.getKey().array());
                flush.values.add(entry.getValue().record);
            }
        }
        last.clear();
        tiles.clear();
        markers = new LinkedHashSet<>();
        maxEventTs = null;
        dropped = 0;
        rows = 0;
        return flush;
    }
}
