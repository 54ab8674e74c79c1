//! The Redis tier: module states shared by every serving process (on any machine) that points at
//! one `redis://` server, or at a Redis Cluster (`?cluster=1`: the URL is a seed node; the
//! client finds the others and follows slot moves).
//!
//! Layout under a namespace of the store format, the model fingerprint, the KV layout and the
//! stored dtype ([`RedisTier::namespace`]), so two models, layouts or dtypes never read each
//! other's entries. The namespace is a hash tag (`pml:{…}`), so on a cluster all of its keys hash
//! to one slot and the multi-key commands below (the LRU script, pipelines) stay legal: a
//! namespace (one model) lives on one node, different models spread over the cluster:
//! - `<ns>:m:<key>` — the entry's meta: `<chunks> <bytes> <digest of the value>`; published last,
//!   with `SET NX`, so its presence means every chunk was written;
//! - `<ns>:c:<key>:<value hash prefix>:<i>` — the value (the same sealed safetensors bytes the disk tier writes) cut
//!   into chunks of at most [`RedisConfig::chunk_bytes`], so no single command moves an unbounded
//!   value and a slow link times out per chunk rather than per module;
//! - `<ns>:lru` — a sorted set of keys by last access, `<ns>:clock` — the access counter that
//!   orders it (one `INCR` per access, on the server, so the order is that of the accesses
//!   whatever the clients' clocks or two accesses in one millisecond), `<ns>:bytes` — bytes held:
//!   the tier's budget is shared by every process of the namespace and evicted oldest first.
//!
//! A read is verified twice: the reassembled value against the meta's digest (a chunk of another
//! write or a truncated value) and then by [`ModuleState::from_safetensors`] (the sealed checksum
//! and every structural check). A damaged entry is deleted and reported as
//! [`StoreError::Corrupt`]; a half-evicted one is a miss.
//!
//! Redis is optional infrastructure: when it is down or slower than [`RedisConfig::timeout`], the
//! tier warns once on stderr, answers misses and [`PutOutcome::Unavailable`] and retries the
//! connection after [`RedisConfig::retry_after`], so the store keeps serving from its local tiers
//! and by recomputing — never a crash, never a wrong state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{Client, ConnectionLike, RedisResult};

use super::StoreError;
use super::key::{STORE_FORMAT_VERSION, StoreKey};
use super::state::{ModuleState, StateSpec};
use super::tier::{PutOutcome, Tier, TierCounters, TierStats};

/// Default bound on one stored value: 1 MiB keeps every command short.
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;
/// Default connect, read and write timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default wait before trying an unreachable server again.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(10);

/// Where the Redis tier connects and how it bounds itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://host:port[/db]`, as the `redis` crate reads it (a cluster's seed node).
    pub url: String,
    /// The server is a Redis Cluster node: connect through the cluster client.
    pub cluster: bool,
    /// Bytes the namespace may hold; `None` leaves eviction to the server's own policy.
    pub budget_bytes: Option<u64>,
    pub timeout: Duration,
    pub chunk_bytes: usize,
    pub retry_after: Duration,
}

impl RedisConfig {
    /// `url` with the default timeouts, chunk size and no budget.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            cluster: false,
            budget_bytes: None,
            timeout: DEFAULT_TIMEOUT,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            retry_after: DEFAULT_RETRY_AFTER,
        }
    }
}

/// Redis tier of one model's states.
pub struct RedisTier {
    config: RedisConfig,
    client: Endpoint,
    spec: StateSpec,
    namespace: String,
    connection: Mutex<Link>,
    warned: AtomicBool,
    counters: TierCounters,
    /// Connections opened or tried: what a down server must not cost on every lookup.
    connects: AtomicU64,
}

/// A server, or a cluster found from its seed node.
enum Endpoint {
    Node(Client),
    Cluster(ClusterClient),
}

/// A connection to either.
type Connection = Box<dyn ConnectionLike + Send>;

/// The connection, or since when the server is known to be unreachable.
enum Link {
    Idle,
    Open(Connection),
    Down { since: Instant },
}

/// The meta of one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Meta {
    chunks: usize,
    bytes: u64,
    /// The store's digest of the value (`checksum::digest_hex`), 32 hex digits.
    checksum: String,
}

impl Meta {
    fn of(value: &[u8], chunk_bytes: usize) -> Self {
        Self {
            chunks: value.len().div_ceil(chunk_bytes).max(1),
            bytes: value.len() as u64,
            checksum: checksum_hex(value),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let mut fields = text.split(' ');
        let meta = Self {
            chunks: fields.next()?.parse().ok()?,
            bytes: fields.next()?.parse().ok()?,
            checksum: fields.next()?.to_string(),
        };
        let sane = fields.next().is_none() && meta.chunks > 0 && meta.checksum.len() == 32;
        sane.then_some(meta)
    }

    fn render(&self) -> String {
        format!("{} {} {}", self.chunks, self.bytes, self.checksum)
    }
}

/// A failed Redis exchange: the server is unreachable or slow (mark the link down) or it answered
/// something this tier did not write (drop the entry).
enum Failure {
    Unreachable(String),
    Store(StoreError),
}

impl From<redis::RedisError> for Failure {
    fn from(error: redis::RedisError) -> Self {
        Failure::Unreachable(error.to_string())
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::Store(error)
    }
}

impl RedisTier {
    /// A tier on `config.url` for states of `spec`. Nothing is contacted yet: an unreachable
    /// server shows up (as a warning) at the first use, so a process starts without Redis.
    pub fn open(config: RedisConfig, spec: StateSpec) -> Result<Self, StoreError> {
        let not_a_url = |error: redis::RedisError| {
            StoreError::Unsupported(format!("`{}` is not a Redis URL: {error}", config.url))
        };
        let client = if config.cluster {
            let builder = ClusterClientBuilder::new(vec![config.url.as_str()])
                .connection_timeout(config.timeout)
                .response_timeout(config.timeout);
            Endpoint::Cluster(builder.build().map_err(not_a_url)?)
        } else {
            Endpoint::Node(Client::open(config.url.as_str()).map_err(not_a_url)?)
        };
        if config.chunk_bytes == 0 {
            return Err(StoreError::Unsupported(
                "the Redis chunk size must be at least one byte".into(),
            ));
        }
        let namespace = Self::namespace(&spec);
        Ok(Self {
            config,
            client,
            spec,
            namespace,
            connection: Mutex::new(Link::Idle),
            warned: AtomicBool::new(false),
            counters: TierCounters::default(),
            connects: AtomicU64::new(0),
        })
    }

    /// `pml:<hash>`: the hash covers the store format version, the model fingerprint, the KV
    /// layout and the stored dtype, so keys of different models, layouts or dtypes live apart
    /// even though every [`StoreKey`] already differs.
    pub fn namespace(spec: &StateSpec) -> String {
        let layout = &spec.layout;
        let described = format!(
            "{STORE_FORMAT_VERSION}|{}|{}|{}|{}|{}|{}",
            spec.model_fingerprint,
            layout.n_layers,
            layout.n_kv_heads,
            layout.head_dim,
            layout.dtype.as_str(),
            spec.state_dtype.as_str()
        );
        format!("pml:{{{}}}", &checksum_hex(described.as_bytes())[..16])
    }

    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    fn meta_key(&self, key: &StoreKey) -> String {
        format!("{}:m:{key}", self.namespace)
    }

    /// Chunks are named by the value's own hash too: serialisations of one state may differ in
    /// byte order (metadata maps), and two writers of one key must never overwrite each other's
    /// chunks under a published meta.
    fn chunk_key(&self, key: &StoreKey, meta: &Meta, index: usize) -> String {
        format!(
            "{}:c:{key}:{}:{index}",
            self.namespace,
            &meta.checksum[..16]
        )
    }

    fn lru_key(&self) -> String {
        format!("{}:lru", self.namespace)
    }

    fn clock_key(&self) -> String {
        format!("{}:clock", self.namespace)
    }

    /// Marks `key` most recently used: its LRU score is the namespace's next access count,
    /// taken and set in one atomic script.
    fn touch(&self, connection: &mut dyn ConnectionLike, key: &StoreKey) -> RedisResult<()> {
        redis::cmd("EVAL")
            .arg("return redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[2]), ARGV[1])")
            .arg(2)
            .arg(self.lru_key())
            .arg(self.clock_key())
            .arg(key.as_str())
            .exec(connection)
    }

    fn bytes_key(&self) -> String {
        format!("{}:bytes", self.namespace)
    }

    /// Runs `exchange` on the connection, opening it first if needed. `None` when the server is
    /// down (known, or found now): the caller degrades to a miss or a skipped put.
    fn with_connection<T>(
        &self,
        exchange: impl FnOnce(&mut dyn ConnectionLike) -> Result<T, Failure>,
    ) -> Result<Option<T>, StoreError> {
        let mut link = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Link::Down { since } = *link
            && since.elapsed() < self.config.retry_after
        {
            self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let connection = match std::mem::replace(&mut *link, Link::Idle) {
            Link::Open(connection) => Ok(connection),
            Link::Idle | Link::Down { .. } => self.connect(),
        };
        let outcome = match connection {
            Ok(mut connection) => {
                let outcome = exchange(connection.as_mut());
                if !matches!(outcome, Err(Failure::Unreachable(_))) {
                    *link = Link::Open(connection);
                }
                outcome
            }
            Err(error) => Err(Failure::Unreachable(error.to_string())),
        };
        match outcome {
            Ok(value) => Ok(Some(value)),
            Err(Failure::Store(error)) => Err(error),
            Err(Failure::Unreachable(reason)) => {
                *link = Link::Down {
                    since: Instant::now(),
                };
                self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the Redis store at {} is unavailable ({reason}); serving from the local \
                         tiers and recomputing, retrying every {} s",
                        self.config.url,
                        self.config.retry_after.as_secs()
                    );
                }
                Ok(None)
            }
        }
    }

    /// Connections opened or tried so far: one per retry period while the server is down,
    /// not one per lookup.
    pub fn connection_attempts(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    fn connect(&self) -> RedisResult<Connection> {
        self.connects.fetch_add(1, Ordering::Relaxed);
        match &self.client {
            Endpoint::Node(client) => {
                let connection = client.get_connection_with_timeout(self.config.timeout)?;
                connection.set_read_timeout(Some(self.config.timeout))?;
                connection.set_write_timeout(Some(self.config.timeout))?;
                Ok(Box::new(connection))
            }
            // Its timeouts were set on the client.
            Endpoint::Cluster(client) => Ok(Box::new(client.get_connection()?)),
        }
    }

    /// The entry's value, verified against its meta; `None` when absent or half evicted.
    fn read_value(
        &self,
        connection: &mut dyn ConnectionLike,
        key: &StoreKey,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let meta_text: Option<String> = redis::cmd("GET")
            .arg(self.meta_key(key))
            .query(connection)?;
        let Some(meta_text) = meta_text else {
            return Ok(None);
        };
        let Some(meta) = Meta::parse(&meta_text) else {
            self.delete_entry(connection, key)?;
            return Err(self
                .corrupt(key, format!("unreadable meta `{meta_text}`"))
                .into());
        };
        let commands: Vec<redis::Cmd> = (0..meta.chunks)
            .map(|index| {
                redis::cmd("GET")
                    .arg(self.chunk_key(key, &meta, index))
                    .clone()
            })
            .collect();
        let chunks: Vec<Option<Vec<u8>>> = self.run_all(connection, commands)?;
        let mut value = Vec::with_capacity(usize::try_from(meta.bytes).unwrap_or(0));
        for chunk in chunks {
            let Some(chunk) = chunk else {
                // Evicted under our feet (by a budget or by the server's maxmemory policy).
                self.delete_entry(connection, key)?;
                return Ok(None);
            };
            value.extend_from_slice(&chunk);
        }
        if value.len() as u64 != meta.bytes || checksum_hex(&value) != meta.checksum {
            self.delete_entry(connection, key)?;
            return Err(self
                .corrupt(key, "chunks do not match the entry's checksum".into())
                .into());
        }
        self.touch(connection, key)?;
        Ok(Some(value))
    }

    /// Writes the chunks, then publishes the meta; accounts and evicts if this write was new.
    fn write_value(
        &self,
        connection: &mut dyn ConnectionLike,
        key: &StoreKey,
        value: &[u8],
    ) -> Result<(), Failure> {
        let meta = Meta::of(value, self.config.chunk_bytes);
        let empty: &[u8] = b"";
        let chunks: Vec<&[u8]> = match value.is_empty() {
            true => vec![empty],
            false => value.chunks(self.config.chunk_bytes).collect(),
        };
        let commands: Vec<redis::Cmd> = chunks
            .into_iter()
            .enumerate()
            .map(|(index, chunk)| {
                redis::cmd("SET")
                    .arg(self.chunk_key(key, &meta, index))
                    .arg(chunk)
                    .clone()
            })
            .collect();
        let _: Vec<redis::Value> = self.run_all(connection, commands)?;
        // Two writers of one key write identical chunks; only the one whose meta lands counts
        // the bytes, so the namespace's byte count does not drift.
        let published: Option<String> = redis::cmd("SET")
            .arg(self.meta_key(key))
            .arg(meta.render())
            .arg("NX")
            .query(connection)?;
        self.touch(connection, key)?;
        if published.is_none() {
            // Another write of this key is published; ours are orphans unless they are its.
            let current: Option<String> = redis::cmd("GET")
                .arg(self.meta_key(key))
                .query(connection)?;
            if current.as_deref().and_then(Meta::parse) != Some(meta.clone()) {
                let ours: Vec<String> = (0..meta.chunks)
                    .map(|index| self.chunk_key(key, &meta, index))
                    .collect();
                redis::cmd("DEL").arg(ours).exec(connection)?;
            }
        }
        if published.is_some() {
            let held: i64 = redis::cmd("INCRBY")
                .arg(self.bytes_key())
                .arg(meta.bytes)
                .query(connection)?;
            self.evict_over_budget(connection, u64::try_from(held).unwrap_or(0))?;
        }
        Ok(())
    }

    /// Runs `commands` in order and returns their replies: pipelined on a single server; one
    /// after the other on a cluster, whose synchronous client does not pipeline (all of an
    /// entry's keys share one slot, so they go to one node either way).
    fn run_all<T: redis::FromRedisValue>(
        &self,
        connection: &mut dyn ConnectionLike,
        commands: Vec<redis::Cmd>,
    ) -> RedisResult<Vec<T>> {
        if self.config.cluster {
            return commands
                .iter()
                .map(|command| command.query(connection))
                .collect();
        }
        let mut pipe = redis::pipe();
        for command in commands {
            pipe.add_command(command);
        }
        pipe.query(connection)
    }

    /// Deletes least recently used entries of the namespace until it fits the budget.
    fn evict_over_budget(
        &self,
        connection: &mut dyn ConnectionLike,
        mut held: u64,
    ) -> Result<(), Failure> {
        let Some(budget) = self.config.budget_bytes else {
            return Ok(());
        };
        while held > budget {
            let oldest: Vec<(String, f64)> = redis::cmd("ZPOPMIN")
                .arg(self.lru_key())
                .query(connection)?;
            let Some((victim, _)) = oldest.into_iter().next() else {
                break;
            };
            let Ok(victim) = StoreKey::parse(&victim) else {
                continue;
            };
            if let Some(freed) = self.delete_entry(connection, &victim)? {
                held = held.saturating_sub(freed);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Deletes an entry (meta first, so readers see it gone) and returns the bytes it held, if
    /// its meta was there.
    fn delete_entry(
        &self,
        connection: &mut dyn ConnectionLike,
        key: &StoreKey,
    ) -> Result<Option<u64>, Failure> {
        let meta_text: Option<String> = redis::cmd("GET")
            .arg(self.meta_key(key))
            .query(connection)?;
        let deleted: u64 = redis::cmd("DEL")
            .arg(self.meta_key(key))
            .query(connection)?;
        redis::cmd("ZREM")
            .arg(self.lru_key())
            .arg(key.as_str())
            .exec(connection)?;
        let meta = meta_text.as_deref().and_then(Meta::parse);
        // Without a readable meta the chunk count is unknown: a scan of the key's chunks is
        // cheap next to leaving them behind.
        let chunk_keys: Vec<String> = match &meta {
            Some(meta) => (0..meta.chunks)
                .map(|index| self.chunk_key(key, meta, index))
                .collect(),
            None => redis::cmd("KEYS")
                .arg(format!("{}:c:{key}:*", self.namespace))
                .query(connection)?,
        };
        if !chunk_keys.is_empty() {
            redis::cmd("DEL").arg(chunk_keys).exec(connection)?;
        }
        match meta {
            Some(meta) if deleted > 0 => {
                redis::cmd("DECRBY")
                    .arg(self.bytes_key())
                    .arg(meta.bytes)
                    .exec(connection)?;
                Ok(Some(meta.bytes))
            }
            _ => Ok(None),
        }
    }

    /// Counts a damaged entry and describes it (the caller has deleted it).
    fn corrupt(&self, key: &StoreKey, reason: String) -> StoreError {
        self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
        StoreError::Corrupt {
            key: key.to_string(),
            location: format!("{} ({})", self.config.url, self.meta_key(key)),
            reason,
        }
    }

    /// Bytes the namespace holds by its shared counter, if the server answers.
    pub fn held_bytes(&self) -> Result<Option<u64>, StoreError> {
        self.with_connection(|connection| {
            let held: Option<i64> = redis::cmd("GET").arg(self.bytes_key()).query(connection)?;
            Ok(held.map_or(0, |held| u64::try_from(held).unwrap_or(0)))
        })
    }
}

impl Tier for RedisTier {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn get(&self, key: &StoreKey) -> Result<Option<Arc<ModuleState>>, StoreError> {
        let value = self.with_connection(|connection| self.read_value(connection, key))?;
        let Some(Some(value)) = value else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        let len = value.len() as u64;
        // The state keeps the value's bytes: its K and V are read from them, not copied out.
        match ModuleState::from_safetensors(Arc::new(value), key, &self.spec) {
            Ok(state) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes_read.fetch_add(len, Ordering::Relaxed);
                Ok(Some(Arc::new(state)))
            }
            Err(StoreError::Malformed(reason) | StoreError::Mismatch { found: reason, .. }) => {
                // The namespace names the model and layout, so neither can be right here.
                self.with_connection(|connection| self.delete_entry(connection, key))?;
                Err(self.corrupt(key, reason))
            }
            Err(error) => Err(error),
        }
    }

    fn put(&self, key: &StoreKey, state: &Arc<ModuleState>) -> Result<PutOutcome, StoreError> {
        let value = state.to_safetensors(key, &self.spec)?;
        let written =
            self.with_connection(|connection| self.write_value(connection, key, &value))?;
        if written.is_none() {
            return Ok(PutOutcome::Unavailable);
        }
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        let bytes = value.len() as u64;
        self.counters
            .bytes_written
            .fetch_add(bytes, Ordering::Relaxed);
        Ok(PutOutcome::Stored { bytes })
    }

    fn contains(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let exists = self.with_connection(|connection| {
            let exists: bool = redis::cmd("EXISTS")
                .arg(self.meta_key(key))
                .query(connection)?;
            Ok(exists)
        })?;
        Ok(exists.unwrap_or(false))
    }

    fn remove(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let removed = self.with_connection(|connection| self.delete_entry(connection, key))?;
        Ok(matches!(removed, Some(Some(_))))
    }

    fn stats(&self) -> TierStats {
        self.counters.snapshot(self.name(), None, None)
    }

    /// Locks are files in this machine's store folder: they coordinate this machine's
    /// processes, not other machines sharing the server.
    fn is_shared(&self) -> bool {
        true
    }
}

/// The store's digest in hex: the whole value is hashed on every read, so the fast hash (see
/// [`super::checksum`]).
fn checksum_hex(bytes: &[u8]) -> String {
    super::checksum::digest_hex(&[bytes])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_rejects_garbage() {
        let meta = Meta::of(&[7; 2500], 1000);
        assert_eq!((meta.chunks, meta.bytes), (3, 2500));
        assert_eq!(Meta::parse(&meta.render()), Some(meta));
        for text in [
            "",
            "3",
            "3 2500",
            "0 0 abc",
            "x 1 2",
            &format!("1 2 {} x", "a".repeat(32)),
            // A format 2 meta (BLAKE3, 64 digits).
            &format!("1 2 {}", "a".repeat(64)),
        ] {
            assert_eq!(Meta::parse(text), None, "{text:?}");
        }
    }
}
