package dev.quiver.jvm.redis;

import java.io.Serializable;

/** The WITH options of a `quiver-redis` table, checked (QuiverRedisSinkFactory). */
final class SinkOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    final String redisUrl;
    final String layoutJson;
    final String markersKey; // null: markers are counted, not recorded
    final int bufferRows;
    final int timeoutMs;
    final long flushIntervalMs; // 0: only on checkpoints, end of input and a full buffer
    final int inFlight; // flushes out on the writer thread at once; 0: written in the task thread

    SinkOptions(String redisUrl, String layoutJson, String markersKey, int bufferRows, int timeoutMs,
            long flushIntervalMs, int inFlight) {
        this.redisUrl = redisUrl;
        this.layoutJson = layoutJson;
        this.markersKey = markersKey;
        this.bufferRows = bufferRows;
        this.timeoutMs = timeoutMs;
        this.flushIntervalMs = flushIntervalMs;
        this.inFlight = inFlight;
    }
}
