//! Synthesis options as a plugin reads them: typed, range-checked, with the
//! defaults of the plugin's own [`OptionSpec`]s (the host sends every option,
//! but a direct caller may send only some), so a default is written once.

use super::error::{Error, Result};
use crate::abi::{find_option, OptionList, OptionSpec, OptionValue};
use std::ops::RangeInclusive;
use std::path::PathBuf;

pub struct OptionReader<'a> {
    list: &'a OptionList,
    specs: &'a [OptionSpec],
}

impl<'a> OptionReader<'a> {
    pub fn new(list: &'a OptionList, specs: &'a [OptionSpec]) -> Self {
        OptionReader { list, specs }
    }

    fn value(&self, key: &str) -> Result<&'a OptionValue> {
        if let Some(v) = find_option(self.list, key) {
            return Ok(v);
        }
        let spec = self.specs.iter().find(|s| s.key.as_str() == key);
        spec.map(|s| &s.default).ok_or_else(|| Error::msg(format!("option `{key}` has no spec (a bug in the plugin)")))
    }

    fn wrong(key: &str, what: &str) -> Error {
        Error::msg(format!("option `{key}` is not {what}"))
    }

    pub fn int(&self, key: &str) -> Result<i64> {
        match self.value(key)? {
            OptionValue::Int(v) => Ok(*v),
            _ => Err(Self::wrong(key, "an integer")),
        }
    }

    /// An integer in `range`: `steps must be in 1..=100, got 0`.
    pub fn int_in(&self, key: &str, range: RangeInclusive<i64>) -> Result<i64> {
        within(key, self.int(key)?, range)
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        match self.value(key)? {
            OptionValue::Bool(v) => Ok(*v),
            _ => Err(Self::wrong(key, "true or false")),
        }
    }

    /// A non-negative integer: `top_k must be non-negative, got -2`.
    pub fn count(&self, key: &str) -> Result<usize> {
        let v = self.int(key)?;
        usize::try_from(v).map_err(|_| Error::msg(format!("{key} must be non-negative, got {v}")))
    }

    /// A float (an integer value is taken as one).
    pub fn float(&self, key: &str) -> Result<f64> {
        match self.value(key)? {
            OptionValue::Float(v) => Ok(*v),
            OptionValue::Int(v) => Ok(*v as f64),
            _ => Err(Self::wrong(key, "a number")),
        }
    }

    /// A float in `range`: `speed must be in 0.5..=2, got 2.5`.
    pub fn float_in(&self, key: &str, range: RangeInclusive<f64>) -> Result<f64> {
        within(key, self.float(key)?, range)
    }

    pub fn string(&self, key: &str) -> Result<String> {
        match self.value(key)? {
            OptionValue::Str(v) => Ok(v.to_string()),
            _ => Err(Self::wrong(key, "a string")),
        }
    }

    /// A path option; `None` when empty (unset).
    pub fn path(&self, key: &str) -> Result<Option<PathBuf>> {
        let s = self.string(key)?;
        Ok((!s.is_empty()).then(|| PathBuf::from(s)))
    }
}

fn within<T: PartialOrd + std::fmt::Display>(key: &str, v: T, range: RangeInclusive<T>) -> Result<T> {
    if range.contains(&v) {
        Ok(v)
    } else {
        Err(Error::msg(format!("{key} must be in {}..={}, got {v}", range.start(), range.end())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{option_list, OptionKind};

    fn specs() -> Vec<OptionSpec> {
        let spec = |key: &str, kind, default| OptionSpec { key: key.into(), kind, default, help: "".into() };
        vec![
            spec("steps", OptionKind::Int, OptionValue::Int(5)),
            spec("speed", OptionKind::Float, OptionValue::Float(1.05)),
            spec("noise", OptionKind::Path, OptionValue::Str("".into())),
        ]
    }

    #[test]
    fn values_defaults_and_range_errors() {
        let specs = specs();
        let empty = OptionList::new();
        let r = OptionReader::new(&empty, &specs);
        assert_eq!(r.int_in("steps", 1..=100), Ok(5));
        assert_eq!(r.float("speed"), Ok(1.05));
        assert_eq!(r.path("noise"), Ok(None));
        assert_eq!(r.int("seed").unwrap_err().as_str(), "option `seed` has no spec (a bug in the plugin)");
        let list = option_list([
            ("steps".to_string(), OptionValue::Int(0)),
            ("speed".to_string(), OptionValue::Int(2)),
            ("noise".to_string(), OptionValue::Str("n.npy".into())),
        ]);
        let r = OptionReader::new(&list, &specs);
        assert_eq!(r.int_in("steps", 1..=100).unwrap_err().as_str(), "steps must be in 1..=100, got 0");
        assert_eq!(r.count("steps"), Ok(0));
        assert_eq!(r.float_in("speed", 0.5..=1.5).unwrap_err().as_str(), "speed must be in 0.5..=1.5, got 2");
        assert_eq!(r.path("noise"), Ok(Some(PathBuf::from("n.npy"))));
        assert_eq!(r.string("steps").unwrap_err().as_str(), "option `steps` is not a string");
        let negative = option_list([("steps".to_string(), OptionValue::Int(-2))]);
        assert_eq!(OptionReader::new(&negative, &specs).count("steps").unwrap_err().as_str(), "steps must be non-negative, got -2");
    }
}
