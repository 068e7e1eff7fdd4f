//! The Python package `tts` (docs/python.md): [`engine::Engine`] opens a
//! profile's model once and synthesizes to numpy arrays, [`stream::Stream`]
//! yields the pieces of one synthesis as the model makes them. Both sit on
//! `engine_core::engine`, the API every front end shares; this crate only
//! turns Python values into its arguments and its results into Python values.

use pyo3::prelude::*;

mod engine;
mod location;
mod options;
mod stream;

pyo3::create_exception!(tts, TtsError, pyo3::exceptions::PyException, "An error of the engine: its one-line message, as the CLI prints it.");

/// An engine error as a [`TtsError`] carrying the engine's message.
pub(crate) fn tts_error(message: impl Into<String>) -> PyErr {
    TtsError::new_err(message.into())
}

#[pymodule]
fn _tts(m: &Bound<'_, PyModule>) -> PyResult<()> {
    location::remember_module_path();
    m.add("TtsError", m.py().get_type::<TtsError>())?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<stream::Stream>()?;
    Ok(())
}
