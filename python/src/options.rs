//! Python keyword arguments as the engine's option overrides (`key`, text),
//! the form `tts --set key=value` gives: the engine parses and checks each
//! against the model's option specs, so its messages are the CLI's.

use engine_core::abi::OptionValue;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

/// `options` (`**options` of a call) as overrides, in the caller's order.
pub fn overrides(options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, String)>> {
    let Some(options) = options else { return Ok(Vec::new()) };
    options
        .iter()
        .map(|(key, value)| {
            let key: String = key.extract()?;
            let text = text_of(&key, &value)?;
            Ok((key, text))
        })
        .collect()
}

/// One value as the text the engine parses. A bool is tested before an
/// int (Python's bool is an int); a float is written so that it parses back
/// to the same double.
fn text_of(key: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    if value.is_instance_of::<PyBool>() {
        return Ok(value.extract::<bool>()?.to_string());
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(value.str()?.to_string());
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(format!("{:?}", value.extract::<f64>()?));
    }
    if value.is_instance_of::<PyString>() {
        return value.extract();
    }
    if value.hasattr("__fspath__")? {
        let path: std::path::PathBuf = value.extract()?;
        return path.to_str().map(str::to_string).ok_or_else(|| PyTypeError::new_err(format!("option `{key}`: the path is not UTF-8")));
    }
    let kind = value.get_type().name()?;
    Err(PyTypeError::new_err(format!("option `{key}`: a {kind} is not an option value (bool, int, float, str or a path)")))
}

/// An option's default as the Python value of its kind.
pub fn python_value<'py>(py: Python<'py>, value: &OptionValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        OptionValue::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        OptionValue::Int(i) => i.into_pyobject(py)?.into_any(),
        OptionValue::Float(f) => f.into_pyobject(py)?.into_any(),
        OptionValue::Str(s) => s.as_str().into_pyobject(py)?.into_any(),
    })
}
