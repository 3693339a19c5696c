package dev.quiver.jvm.redis;

import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.Protocol;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisException;
import redis.clients.jedis.util.JedisClusterCRC16;

/**
 * A Redis Cluster for {@link RedisWriter}: the slot map (CLUSTER SLOTS) and one connection per master, what
 * quiver/online/redis_cluster.py keeps on the Python side. URL: {@code redis+cluster://[user:password@]host:port,
 * host:port…} ({@code rediss+cluster://} for TLS), the seed nodes. The writer sends each slot's keys as one script
 * call to the master of that slot (layout.py's keys put every view of one entity in one slot); after a
 * redirection or a lost master it calls {@link #reset()} and the next call reads the map again.
 */
final class ClusterRoute implements AutoCloseable {
    static final int SLOTS = 16384;

    private final List<HostAndPort> seeds = new ArrayList<>();
    private final JedisClientConfig config;
    private final HostAndPort[] owner = new HostAndPort[SLOTS];
    private final Set<HostAndPort> masters = new LinkedHashSet<>();
    private final Map<HostAndPort, Jedis> connections = new HashMap<>();
    private boolean mapped;

    static boolean isCluster(String url) {
        return url.startsWith("redis+cluster://") || url.startsWith("rediss+cluster://");
    }

    ClusterRoute(String url, int timeoutMs) {
        boolean tls = url.startsWith("rediss+cluster://");
        String rest = url.substring(url.indexOf("://") + 3);
        int q = rest.indexOf('?');
        if (q >= 0) {
            rest = rest.substring(0, q);
        }
        DefaultJedisClientConfig.Builder builder =
                DefaultJedisClientConfig.builder().timeoutMillis(timeoutMs).ssl(tls);
        int at = rest.lastIndexOf('@');
        if (at >= 0) {
            String credentials = rest.substring(0, at);
            int colon = credentials.indexOf(':');
            String user = colon >= 0 ? credentials.substring(0, colon) : "";
            String password = colon >= 0 ? credentials.substring(colon + 1) : credentials;
            if (!user.isEmpty()) {
                builder.user(URLDecoder.decode(user, StandardCharsets.UTF_8));
            }
            builder.password(URLDecoder.decode(password, StandardCharsets.UTF_8));
            rest = rest.substring(at + 1);
        }
        int slash = rest.indexOf('/');
        if (slash >= 0) {
            rest = rest.substring(0, slash);
        }
        for (String part : rest.split(",")) {
            int colon = part.lastIndexOf(':');
            if (part.isEmpty() || colon <= 0) {
                throw new IllegalArgumentException("redis.url: " + part + " is not host:port in a redis+cluster:// URL");
            }
            seeds.add(new HostAndPort(part.substring(0, colon), Integer.parseInt(part.substring(colon + 1))));
        }
        this.config = builder.build();
    }

    /** The master that serves {@code key}'s slot (the map read first when there is none). */
    HostAndPort ownerOf(byte[] key) {
        if (!mapped) {
            refresh();
        }
        return owner[JedisClusterCRC16.getSlot(key)];
    }

    static int slotOf(byte[] key) {
        return JedisClusterCRC16.getSlot(key);
    }

    Jedis connection(HostAndPort master) {
        return connections.computeIfAbsent(master, node -> new Jedis(node, config));
    }

    /** Forget the map and the connections: the next call reads the map again (after a redirection, a failover). */
    void reset() {
        mapped = false;
        closeConnections();
    }

    private void refresh() {
        List<HostAndPort> candidates = new ArrayList<>(masters);
        candidates.addAll(seeds);
        JedisException last = null;
        for (HostAndPort node : new LinkedHashSet<>(candidates)) {
            try (Jedis j = new Jedis(node, config)) {
                Object reply = j.sendCommand(Protocol.Command.CLUSTER, "SLOTS");
                fill((List<?>) reply, node.getHost());
                return;
            } catch (JedisException e) {
                last = e;
            }
        }
        throw new JedisConnectionException("no node of the Redis Cluster " + seeds + " answered CLUSTER SLOTS", last);
    }

    private void fill(List<?> ranges, String asked) {
        java.util.Arrays.fill(owner, null);
        masters.clear();
        for (Object entry : ranges) {
            List<?> range = (List<?>) entry;
            int first = ((Long) range.get(0)).intValue();
            int last = ((Long) range.get(1)).intValue();
            List<?> master = (List<?>) range.get(2);
            String host = new String((byte[]) master.get(0), StandardCharsets.UTF_8);
            HostAndPort node = new HostAndPort(host.isEmpty() ? asked : host, ((Long) master.get(1)).intValue());
            masters.add(node);
            for (int slot = first; slot <= last; slot++) {
                owner[slot] = node;
            }
        }
        for (int slot = 0; slot < SLOTS; slot++) {
            if (owner[slot] == null) {
                throw new JedisConnectionException("the Redis Cluster " + seeds + " assigns no node to slot " + slot
                        + " (CLUSTERDOWN until every slot is assigned)");
            }
        }
        mapped = true;
    }

    private void closeConnections() {
        for (Jedis j : connections.values()) {
            try {
                j.close();
            } catch (RuntimeException ignored) {
                // a broken connection may fail to close; a new one is made on the next call
            }
        }
        connections.clear();
    }

    @Override
    public void close() {
        closeConnections();
    }
}
