package dev.quiver.jvm.redis;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

/**
 * Sends flushes to Redis on one thread of its own, in the order they were handed over, so the task thread goes on
 * with the next rows while Redis runs the scripts of the last ones. At most {@code inFlight} flushes are out at once
 * (the one being written and those queued behind it): the next {@link #submit} waits for the oldest, which bounds
 * memory and passes Redis's pace back to the job. {@link #awaitAll} is the barrier: the sink calls it before each
 * checkpoint and at end of input, so a checkpoint still completes only after its rows are in Redis. One thread and
 * one connection keep the writes in order, so a marker still follows every row written before it.
 * A failed write surfaces on the task thread at the next submit or barrier, with its own message.
 */
final class BackgroundWrites implements AutoCloseable {
    /** What a finished write reports back to the task thread (Flink's counters are not thread-safe). */
    interface Done {
        void written(FlushBuffer.Flush flush);
    }

    private final RedisWriter redis;
    private final int inFlight;
    private final Done done;
    private final ExecutorService thread;
    private final Deque<Future<FlushBuffer.Flush>> pending = new ArrayDeque<>();

    BackgroundWrites(RedisWriter redis, int inFlight, String view, Done done) {
        if (inFlight < 1) {
            throw new IllegalArgumentException("inFlight must be positive, got " + inFlight);
        }
        this.redis = redis;
        this.inFlight = inFlight;
        this.done = done;
        this.thread = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "quiver-redis-writer-" + view);
            t.setDaemon(true); // a cancelled task must not keep its TaskManager alive
            return t;
        });
    }

    /** Hand a flush to the writer thread; waits first while {@code inFlight} flushes are still out. */
    void submit(FlushBuffer.Flush flush) throws IOException {
        reapFinished();
        while (pending.size() >= inFlight) {
            awaitOldest();
        }
        pending.add(thread.submit(() -> {
            redis.write(flush);
            return flush;
        }));
    }

    /** Wait until every flush handed over is in Redis; the first failure is thrown. */
    void awaitAll() throws IOException {
        while (!pending.isEmpty()) {
            awaitOldest();
        }
    }

    /** Flushes handed over and not yet reported written. */
    int pending() {
        return pending.size();
    }

    private void reapFinished() throws IOException {
        while (!pending.isEmpty() && pending.peekFirst().isDone()) {
            awaitOldest();
        }
    }

    private void awaitOldest() throws IOException {
        Future<FlushBuffer.Flush> oldest = pending.pollFirst();
        try {
            done.written(oldest.get());
        } catch (ExecutionException e) {
            failAll();
            Throwable cause = e.getCause();
            if (cause instanceof IOException io) {
                throw io;
            }
            throw new IOException("Redis write failed: " + cause, cause);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while waiting for a Redis write");
        }
    }

    /** After a failure the job restarts from its checkpoint: writes queued behind it are not worth sending. */
    private void failAll() {
        for (Future<FlushBuffer.Flush> f : pending) {
            f.cancel(false);
        }
        pending.clear();
    }

    @Override
    public void close() {
        // Closed without a barrier (a cancelled or failing task): what is still queued is replayed from the last
        // checkpoint, so it is dropped; the write under way may finish (idempotent) before the connection closes.
        failAll();
        thread.shutdown();
        try {
            if (!thread.awaitTermination(30, TimeUnit.SECONDS)) {
                thread.shutdownNow();
            }
        } catch (InterruptedException e) {
            thread.shutdownNow();
            Thread.currentThread().interrupt();
        }
        redis.close();
    }
}
