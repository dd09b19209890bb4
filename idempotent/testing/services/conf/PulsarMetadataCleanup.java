/*
 * Removes stale *ephemeral* entries from a stopped Pulsar standalone's RocksDB
 * metadata store (data/metadata). Run by idempotent.testing.services before a
 * Pulsar JVM is started on an existing data dir (restart, kill9 + up(fresh=False)):
 *
 *   java -cp '<pulsar lib>/*' PulsarMetadataCleanup.java <workdir>/data/metadata
 *
 * Why: Pulsar 3.0.x standalone keeps its metadata in RocksDB (PIP-117), where an
 * "ephemeral" node is an ordinary key tagged with the owner's instance id. After a
 * kill -9 the bookie registration /ledgers/available/<host:port> survives. At the
 * next start the bookie's ResourceLock finds it, the store lazily deletes it, the
 * resulting "deleted" notification invalidates the lock, and because
 * BookieServiceInfo has no equals() every revalidation deletes and re-creates the
 * node, which notifies again: thousands of delete/create cycles per second, and
 * sometimes the broker ends with no writable bookie ("Not enough bookies",
 * "Cannot resolve bookieId") while /admin/v2/brokers/health still says ok.
 * With ZooKeeper the session expiry would delete these nodes; here nothing does,
 * so we do it while no Pulsar process holds the store: every ephemeral key is stale.
 *
 * Value layout (RocksdbMetadataStore.MetaValue, format v1): int headerSize,
 * int formatVersion, long version, long owner, long created, long modified,
 * byte ephemeral, data. Needs only rocksdbjni, which is on Pulsar's classpath.
 */

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksIterator;
import org.rocksdb.TransactionDB;
import org.rocksdb.TransactionDBOptions;
import org.rocksdb.WriteOptions;

public class PulsarMetadataCleanup {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: PulsarMetadataCleanup <metadata dir>");
            System.exit(2);
        }
        RocksDB.loadLibrary();
        List<byte[]> stale = new ArrayList<>();
        try (Options options = new Options().setCreateIfMissing(false);
             TransactionDBOptions txOptions = new TransactionDBOptions();
             TransactionDB db = TransactionDB.open(options, txOptions, args[0]);
             WriteOptions writeOptions = new WriteOptions().setSync(true)) {
            try (RocksIterator it = db.newIterator()) {
                for (it.seekToFirst(); it.isValid(); it.next()) {
                    byte[] key = it.key();
                    byte[] value = it.value();
                    if (key.length == 0 || key[0] != '/' || value == null || value.length < 41) {
                        continue; // internal keys (instance id, sequence) and foreign formats
                    }
                    ByteBuffer buffer = ByteBuffer.wrap(value);
                    int headerSize = buffer.getInt();
                    int formatVersion = buffer.getInt();
                    if (formatVersion < 1 || headerSize < 41 || value.length < headerSize) {
                        continue;
                    }
                    if (value[40] != 0) {
                        stale.add(key);
                    }
                }
            }
            for (byte[] key : stale) {
                db.delete(writeOptions, key);
                System.out.println("deleted stale ephemeral " + new String(key, StandardCharsets.UTF_8));
            }
        }
        System.out.println("removed " + stale.size() + " stale ephemeral node(s)");
    }
}
