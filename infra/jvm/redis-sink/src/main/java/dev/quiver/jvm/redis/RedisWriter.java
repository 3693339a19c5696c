package dev.quiver.jvm.redis;

import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.Response;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.exceptions.JedisException;
import redis.clients.jedis.exceptions.JedisRedirectionException;

/**
 * Sends a flush to Redis with the online store's own Lua scripts (online/lua/*.lua, bundled in the jar): the data
 * in pipelined EVALSHA calls of a few hundred keys, then — only once every data call succeeded — the view's
 * freshness (meta script) and the batch markers (SADD), so a reader that sees a marker knows every earlier row
 * is written. Every call is idempotent, so a failed flush is simply sent again after the job restarts.
 *
 * <p>On a Redis Cluster ({@code redis+cluster://}, see {@link ClusterRoute}) each call holds the keys of one slot
 * and goes to that slot's master, every master's calls pipelined; a redirection or a lost master (a failover)
 * reads the map again and sends the whole flush once more, until {@link #CLUSTER_RETRY_MS} has passed.
 */
final class RedisWriter implements AutoCloseable {
    /** Keys per script call: redis_store.py's batch size. */
    static final int BATCH_KEYS = 500;

    /** How long a cluster write keeps retrying through redirections and a failover (node timeout + election). */
    static final long CLUSTER_RETRY_MS = 30_000;

    /** A script's text and its SHA-1 (what EVALSHA names). */
    static final class Script {
        final String name;
        final byte[] body;
        final byte[] sha;

        Script(String name) {
            this.name = name;
            String path = "lua/" + name + ".lua";
            try (InputStream in = RedisWriter.class.getResourceAsStream(path)) {
                if (in == null) {
                    throw new IllegalStateException("the jar lacks " + path + ": rebuild it (scripts/jars.sh)");
                }
                body = in.readAllBytes();
                sha = HexFormat.of().formatHex(MessageDigest.getInstance("SHA-1").digest(body))
                        .getBytes(StandardCharsets.US_ASCII);
            } catch (IOException | NoSuchAlgorithmException e) {
                throw new IllegalStateException("cannot read " + path, e);
            }
        }
    }

    /** One script call, kept so a NOSCRIPT reply can send it again. */
    private static final class Call {
        final Script script;
        final int keyCount;
        final byte[][] args;

        Call(Script script, int keyCount, byte[][] args) {
            this.script = script;
            this.keyCount = keyCount;
            this.args = args;
        }
    }

    private final String url;
    private final int timeoutMs;
    private final SinkLayout layout;
    private final byte[] markersKey;
    private final Script data;
    private final Script meta = new Script("meta");
    private Jedis jedis;
    private final ClusterRoute cluster; // null: one server

    RedisWriter(String url, int timeoutMs, SinkLayout layout, String markersKey) {
        this.cluster = ClusterRoute.isCluster(url) ? new ClusterRoute(url, timeoutMs) : null;
        this.url = url;
        this.timeoutMs = timeoutMs;
        this.layout = layout;
        this.markersKey = markersKey == null ? null : markersKey.getBytes(StandardCharsets.UTF_8);
        this.data = new Script(layout.script);
    }

    /** Write a flush; on a lost connection reconnect and send it once more (every call is idempotent). */
    void write(FlushBuffer.Flush flush) throws IOException {
        if (flush.isEmpty()) {
            return;
        }
        long deadline = System.currentTimeMillis() + CLUSTER_RETRY_MS;
        for (int attempt = 0; ; attempt++) {
            try {
                send(flush);
                return;
            } catch (JedisDataException e) { // a refusal (wrong credentials, a script error): retrying won't help
                disconnect();
                if (!(cluster != null && moved(e) && System.currentTimeMillis() < deadline)) {
                    throw new IOException("Redis refused a write of view " + layout.view + ": " + e.getMessage(), e);
                }
            } catch (JedisException e) {
                disconnect();
                if (attempt > 0 && !(cluster != null && System.currentTimeMillis() < deadline)) {
                    throw new IOException("Redis write of view " + layout.view + " failed: " + e.getMessage(), e);
                }
            }
            if (cluster != null && attempt > 0) {
                try {
                    Thread.sleep(Math.min(1000, 50L << Math.min(attempt, 5)));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IOException("interrupted while retrying a write of view " + layout.view, e);
                }
            }
        }
    }

    /** A cluster's answer that the map moved: read it again and send once more. */
    private static boolean moved(JedisDataException e) {
        String m = e.getMessage() == null ? "" : e.getMessage();
        return e instanceof JedisRedirectionException || m.startsWith("MOVED") || m.startsWith("ASK")
                || m.startsWith("TRYAGAIN") || m.startsWith("CLUSTERDOWN");
    }

    private void send(FlushBuffer.Flush flush) {
        List<Call> calls = new ArrayList<>();
        if (cluster == null) {
            for (int start = 0; start < flush.keys.size(); start += BATCH_KEYS) {
                int end = Math.min(start + BATCH_KEYS, flush.keys.size());
                calls.add(dataCall(flush, start, end));
            }
        } else { // one call per slot: a cluster refuses a script whose keys span slots
            Map<Integer, List<Integer>> bySlot = new TreeMap<>();
            for (int i = 0; i < flush.keys.size(); i++) {
                bySlot.computeIfAbsent(ClusterRoute.slotOf(flush.keys.get(i)), s -> new ArrayList<>()).add(i);
            }
            for (List<Integer> rows : bySlot.values()) {
                for (int start = 0; start < rows.size(); start += BATCH_KEYS) {
                    calls.add(dataCall(flush, rows.subList(start, Math.min(start + BATCH_KEYS, rows.size()))));
                }
            }
        }
        run(calls); // the data first: freshness and markers promise it is there
        List<Call> after = new ArrayList<>();
        if (flush.maxEventTs != null) {
            byte[] ts = Long.toString(flush.maxEventTs).getBytes(StandardCharsets.US_ASCII);
            after.add(new Call(meta, 1, new byte[][] {layout.metaKey.getBytes(StandardCharsets.UTF_8), ts}));
        }
        run(after);
        if (markersKey != null && !flush.markers.isEmpty()) {
            byte[][] members = flush.markers.stream().map(m -> m.getBytes(StandardCharsets.UTF_8))
                    .toArray(byte[][]::new);
            connectionFor(markersKey).sadd(markersKey, members);
        }
    }

    /** The script call of rows {@code start} to {@code end} of the flush (one server: any rows). */
    private Call dataCall(FlushBuffer.Flush flush, int start, int end) {
        int n = end - start;
        int extra = layout.isTiles() ? 3 : 0;
        byte[][] args = new byte[2 * n + extra][];
        for (int i = 0; i < n; i++) {
            args[i] = flush.keys.get(start + i);
            args[n + extra + i] = flush.values.get(start + i);
        }
        return withExtra(args, n);
    }

    /** The script call of the given rows of the flush (a cluster: the rows of one slot). */
    private Call dataCall(FlushBuffer.Flush flush, List<Integer> rows) {
        int n = rows.size();
        int extra = layout.isTiles() ? 3 : 0;
        byte[][] args = new byte[2 * n + extra][];
        for (int i = 0; i < n; i++) {
            args[i] = flush.keys.get(rows.get(i));
            args[n + extra + i] = flush.values.get(rows.get(i));
        }
        return withExtra(args, n);
    }

    private Call withExtra(byte[][] args, int n) {
        if (layout.isTiles()) { // TILE_SCRIPT's ARGV: width, var_len offset (0: none), horizon µs
            args[n] = ascii(layout.width);
            args[n + 1] = ascii(layout.varLenOffset);
            args[n + 2] = ascii(layout.trimHorizonUs);
        }
        return new Call(data, n, args);
    }

    private static byte[] ascii(long v) {
        return Long.toString(v).getBytes(StandardCharsets.US_ASCII);
    }

    /** Pipeline the calls as EVALSHA; calls answered NOSCRIPT (a restarted or flushed server) go again as EVAL.
     * On a cluster, each master's calls (by the slot of their first key) in a pipeline of its own. */
    private void run(List<Call> calls) {
        if (calls.isEmpty()) {
            return;
        }
        if (cluster != null) {
            Map<HostAndPort, List<Call>> byMaster = new LinkedHashMap<>();
            for (Call c : calls) {
                byMaster.computeIfAbsent(cluster.ownerOf(c.args[0]), m -> new ArrayList<>()).add(c);
            }
            for (Map.Entry<HostAndPort, List<Call>> e : byMaster.entrySet()) {
                run(cluster.connection(e.getKey()), e.getValue());
            }
            return;
        }
        run(connection(), calls);
    }

    private void run(Jedis connection, List<Call> calls) {
        List<Call> missing = new ArrayList<>();
        List<Response<Object>> replies = new ArrayList<>(calls.size());
        try (Pipeline p = connection.pipelined()) {
            for (Call c : calls) {
                replies.add(p.evalsha(c.script.sha, c.keyCount, c.args));
            }
            p.sync();
        }
        JedisDataException refused = null;
        for (int i = 0; i < calls.size(); i++) {
            try {
                replies.get(i).get();
            } catch (JedisDataException e) {
                if (e.getMessage() != null && e.getMessage().startsWith("NOSCRIPT")) {
                    missing.add(calls.get(i));
                } else if (refused == null) {
                    refused = e;
                }
            }
        }
        if (refused != null) { // every reply is read first: the connection stays in step
            throw refused;
        }
        if (missing.isEmpty()) {
            return;
        }
        // EVAL caches the script server-side too, so the next flush's EVALSHA finds it.
        try (Pipeline p = connection.pipelined()) {
            List<Response<Object>> again = new ArrayList<>();
            for (Call c : missing) {
                again.add(p.eval(c.script.body, c.keyCount, c.args));
            }
            p.sync();
            for (Response<Object> r : again) {
                r.get();
            }
        }
    }

    private Jedis connectionFor(byte[] key) {
        return cluster == null ? connection() : cluster.connection(cluster.ownerOf(key));
    }

    private Jedis connection() {
        if (jedis == null) {
            jedis = url.startsWith("unix://") ? unix(url, timeoutMs) : new Jedis(URI.create(url), timeoutMs);
        }
        return jedis;
    }

    /** unix:///path/redis.sock[?db=N]: the embedded Redis's socket (no password: its folder is private). */
    static Jedis unix(String url, int timeoutMs) {
        // Not java.net.URI: the socket's path is written as is (a project folder may hold spaces).
        String rest = url.substring("unix://".length());
        int q = rest.indexOf('?');
        int db = 0;
        if (q >= 0) {
            for (String pair : rest.substring(q + 1).split("&")) {
                if (pair.startsWith("db=")) {
                    db = Integer.parseInt(pair.substring(3));
                }
            }
            rest = rest.substring(0, q);
        }
        return new Jedis(new UnixSocketFactory(Path.of(rest), timeoutMs),
                DefaultJedisClientConfig.builder().timeoutMillis(timeoutMs).database(db).build());
    }

    private void disconnect() {
        if (cluster != null) {
            cluster.reset();
        }
        if (jedis != null) {
            try {
                jedis.close();
            } catch (RuntimeException ignored) {
                // closing a broken connection may fail too; a new one is made on the next write
            }
            jedis = null;
        }
    }

    @Override
    public void close() {
        disconnect();
        if (cluster != null) {
            cluster.close();
        }
    }
}
