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

    /** One entity's rows in this flush: its Redis key, built once, and the rows kept for it. */
    private static final class Entity {
        final byte[] key;
        RowEncoder.Encoded last; // last values
        NavigableMap<Long, RowEncoder.Encoded> tiles; // tiles, by tile_start

        Entity(byte[] key) {
            this.key = key;
        }
    }

    private final SinkLayout layout;
    private final RowEncoder encoder;
    // By the entity's own values (RowEncoder.entity), not its key bytes: a Long hashes and compares far cheaper
    // than a 30-byte key, and this lookup runs for every row the job emits (the profile's largest sink cost).
    private final Map<Object, Entity> entities = new HashMap<>();
    private Set<String> markers = new LinkedHashSet<>();
    private long maxEventTs = Long.MIN_VALUE; // a primitive: this runs for every row (no box per row)
    private boolean featureRows;
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
        long newest = encoder.newest(row);
        maxEventTs = Math.max(maxEventTs, newest);
        featureRows = true;
        Object id = encoder.entity(row);
        Entity entity = entities.get(id);
        if (entity == null) {
            entity = new Entity(encoder.key(row));
            entities.put(id, entity);
        }
        long time = encoder.time(row);
        // A row that loses to the one kept is never encoded.
        if (layout.isTiles()) {
            if (entity.tiles == null) {
                entity.tiles = new TreeMap<>();
            }
            RowEncoder.Encoded old = entity.tiles.get(time);
            if (old == null || encoder.events(row) >= old.events) {
                entity.tiles.put(time, encoder.encode(row));
            }
        } else {
            RowEncoder.Encoded old = entity.last;
            if (old == null || time > old.time) {
                entity.last = encoder.encode(row);
            } else if (time == old.time) {
                RowEncoder.Encoded e = encoder.encode(row);
                if (RowEncoder.compareOrder(e.order, old.order) >= 0) {
                    entity.last = e;
                }
            }
        }
    }

    /** Everything buffered, reduced to one value per key; the buffer starts empty again. */
    Flush drain() {
        Flush flush = new Flush(markers, featureRows ? maxEventTs : null, dropped, rows);
        for (Entity entity : entities.values()) {
            flush.keys.add(entity.key);
            if (!layout.isTiles()) {
                flush.values.add(entity.last.record);
            } else {
                NavigableMap<Long, RowEncoder.Encoded> byStart = entity.tiles;
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
                flush.values.add(value.array());
            }
        }
        entities.clear();
        markers = new LinkedHashSet<>();
        maxEventTs = Long.MIN_VALUE;
        featureRows = false;
        dropped = 0;
        rows = 0;
        return flush;
    }
}
