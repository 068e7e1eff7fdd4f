//! The engine's core: what a plugin must export ([`abi`]), how the host finds and
//! checks plugins ([`loader`]), the TOML profile ([`profile`]), capability probes
//! that backend plugins run on their devices ([`probes`]), policy resolution
//! ([`policy`]), helpers for writing backend plugins ([`backend_kit`]), and the
//! host-side engine that ties them together ([`engine`]).

pub mod abi;
pub mod audio;
pub mod backend_kit;
pub mod compare;
pub mod engine;
pub mod loader;
pub mod logging;
pub mod model_kit;
pub mod output;
pub mod policy;
pub mod probes;
pub mod profile;

pub use abi::PLUGIN_ABI_VERSION;
