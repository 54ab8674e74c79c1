//! The one layer stream: a loader thread reads a unit's stored layers in layer order into a small
//! channel while the caller computes, so loading layer `i + 1` overlaps computing layer `i`.
//! Blend's pipelined splice ([`crate::inference`]) and HCache's restore ([`crate::restore`]) both
//! stream through it, reading each layer with [`read_layer`] under the key
//! [`crate::unit_key::UnitKey::layer`] gives it, and both fall back to the unit's whole state or
//! its tokens on a [`LayerError`], which is why the errors are typed rather than strings: a caller
//! tells an unusable entry (fall back) from a bug (the loader sent layers out of order).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::time::{Duration, Instant};

use pml_engine::model::EngineError;

use crate::store::{ModuleState, StateKind, StoreError, StoreKey};

/// Layers the loader may read ahead of the compute side: enough to hide one slow read, few enough
/// that a stream abandoned mid-way has not read the whole unit for nothing.
const PREFETCH_LAYERS: usize = 2;

/// Why a layer could not be streamed.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer {layer} is not in the store")]
    Missing { layer: usize },
    #[error("layer {layer} could not be read: {source}")]
    Store {
        layer: usize,
        #[source]
        source: StoreError,
    },
    #[error("the stored layer {layer} holds a {found} state, not a {expected} one")]
    WrongKind {
        layer: usize,
        found: &'static str,
        expected: &'static str,
    },
    #[error("the stored layer {layer} is for other tokens or positions")]
    OtherUnit { layer: usize },
    #[error("the stored layer {layer} is a hidden-state layer without its hidden states")]
    NoHiddenStates { layer: usize },
    #[error(
        "layer {layer} has no store key (a key names at most {} layers)",
        u16::MAX
    )]
    NoKey { layer: usize },
    #[error("layer {layer} could not be placed: {source}")]
    Engine {
        layer: usize,
        #[source]
        source: Box<EngineError>,
    },
    #[error("layer {layer} was asked for, but streaming starts at layer {first}")]
    BeforeStream { layer: usize, first: usize },
    #[error("the loader stopped before layer {layer}")]
    LoaderStopped { layer: usize },
    #[error("the loader sent layer {sent}, expected {expected}")]
    OutOfOrder { sent: usize, expected: usize },
    #[error("the loader thread panicked")]
    LoaderPanicked,
}

impl LayerError {
    /// Wraps an engine (or KV-cache, or tensor) failure while placing `layer`.
    pub fn engine<E: Into<EngineError>>(layer: usize) -> impl FnOnce(E) -> LayerError {
        move |source| LayerError::Engine {
            layer,
            source: Box::new(source.into()),
        }
    }
}

/// The store id of layer `layer` (what [`StateKind::KvLayer`] and [`StateKind::HiddenLayer`]
/// carry).
pub fn layer_id(layer: usize) -> Result<u16, LayerError> {
    u16::try_from(layer).map_err(|_| LayerError::NoKey { layer })
}

/// Reads layer `layer` of a unit through `load` and checks that it is that unit's (`tokens` at
/// `positions`) in the form `kind`: a key names its content, but an entry written by another
/// build or damaged in a way its checksum missed must not be spliced into a prompt.
pub fn read_layer(
    load: impl FnOnce(&StoreKey) -> Result<Option<Arc<ModuleState>>, StoreError>,
    key: &StoreKey,
    layer: usize,
    kind: StateKind,
    tokens: &[u32],
    positions: &[u32],
) -> Result<Arc<ModuleState>, LayerError> {
    let state = load(key)
        .map_err(|source| LayerError::Store { layer, source })?
        .ok_or(LayerError::Missing { layer })?;
    if state.kind() != kind {
        return Err(LayerError::WrongKind {
            layer,
            found: state.kind().name(),
            expected: kind.name(),
        });
    }
    if state.tokens() != tokens || state.positions() != positions {
        return Err(LayerError::OtherUnit { layer });
    }
    Ok(state)
}

/// One loaded layer as the loader sent it.
struct Loaded<T> {
    layer: usize,
    item: T,
    /// The loader's time on this layer.
    fetch: Duration,
}

/// The compute side's end of a stream: layers arrive in the order the loader was given.
pub struct LayerReceiver<T> {
    receiver: Receiver<Loaded<T>>,
    waited: Duration,
    fetched: Duration,
    received: usize,
}

impl<T> LayerReceiver<T> {
    /// The next loaded layer, which must be `layer`; [`LayerError::LoaderStopped`] once the loader
    /// is gone.
    pub fn next(&mut self, layer: usize) -> Result<T, LayerError> {
        let wait = Instant::now();
        let loaded = self.receiver.recv();
        self.waited += wait.elapsed();
        let loaded = loaded.map_err(|_| LayerError::LoaderStopped { layer })?;
        if loaded.layer != layer {
            return Err(LayerError::OutOfOrder {
                sent: loaded.layer,
                expected: layer,
            });
        }
        self.fetched += loaded.fetch;
        self.received += 1;
        Ok(loaded.item)
    }

    /// Time the compute side spent waiting for the loader.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The loader's time on the layers received so far.
    pub fn fetched(&self) -> Duration {
        self.fetched
    }

    /// Layers received so far.
    pub fn received(&self) -> usize {
        self.received
    }
}

/// Runs `consume` on the receiving end of a stream of `fetch(layer)` for each of `layers` in
/// order, read at most [`PREFETCH_LAYERS`] ahead by a loader thread. Once the layers are sent, or
/// `consume` has returned (it hangs up: a consumer that gives up stops the reading), the loader
/// runs `after` — work that must not delay the compute side — and its result comes back with
/// `consume`'s.
pub fn stream_layers<T, A, R>(
    layers: impl IntoIterator<Item = usize, IntoIter: Send>,
    mut fetch: impl FnMut(usize) -> T + Send,
    after: impl FnOnce() -> A + Send,
    consume: impl FnOnce(LayerReceiver<T>) -> R,
) -> Result<(R, A), LayerError>
where
    T: Send,
    A: Send,
{
    let layers = layers.into_iter();
    let (sender, receiver) = sync_channel::<Loaded<T>>(PREFETCH_LAYERS);
    std::thread::scope(|scope| {
        let loader = scope.spawn(move || {
            for layer in layers {
                let started = Instant::now();
                let item = fetch(layer);
                let fetch = started.elapsed();
                if sender.send(Loaded { layer, item, fetch }).is_err() {
                    break;
                }
            }
            drop(sender);
            after()
        });
        let consumed = consume(LayerReceiver {
            receiver,
            waited: Duration::ZERO,
            fetched: Duration::ZERO,
            received: 0,
        });
        let after = loader.join().map_err(|_| LayerError::LoaderPanicked)?;
        Ok((consumed, after))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_arrive_in_order_and_the_loader_runs_after_last() {
        let ((sum, count), after) = stream_layers(
            3..7,
            |layer| layer * 10,
            || "after",
            |mut receiver| {
                let mut sum = 0;
                for layer in 3..7 {
                    sum += receiver.next(layer).unwrap();
                }
                assert!(matches!(
                    receiver.next(7),
                    Err(LayerError::LoaderStopped { layer: 7 })
                ));
                (sum, receiver.received())
            },
        )
        .unwrap();
        assert_eq!((sum, count, after), (180, 4, "after"));
    }

    #[test]
    fn a_layer_out_of_order_is_an_error() {
        let (result, ()) = stream_layers(
            [0, 2],
            |layer| layer,
            || (),
            |mut receiver| {
                receiver.next(0).unwrap();
                receiver.next(1)
            },
        )
        .unwrap();
        assert!(matches!(
            result,
            Err(LayerError::OutOfOrder {
                sent: 2,
                expected: 1
            })
        ));
    }

    #[test]
    fn a_consumer_that_hangs_up_stops_the_loader() {
        let fetched = std::sync::atomic::AtomicUsize::new(0);
        let ((), ()) = stream_layers(
            0..1000,
            |layer| {
                fetched.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                layer
            },
            || (),
            |mut receiver| {
                receiver.next(0).unwrap();
            },
        )
        .unwrap();
        // One received, up to PREFETCH_LAYERS queued, and the one whose send found no receiver.
        assert!(fetched.into_inner() <= 2 + PREFETCH_LAYERS);
    }

    #[test]
    fn a_panicking_loader_is_an_error_not_a_panic() {
        let result = stream_layers(
            0..2,
            |layer| {
                if layer == 1 {
                    panic!("deliberate");
                }
                layer
            },
            || (),
            |mut receiver| receiver.next(0).unwrap(),
        );
        assert!(matches!(result, Err(LayerError::LoaderPanicked)));
    }
}
