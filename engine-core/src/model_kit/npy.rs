//! NumPy `.npy` arrays a plugin reads at synthesis time: recorded random
//! draws and initial noise (parity runs inject what the reference drew).

use super::error::{Error, Result};
use std::path::Path;

/// A float32 or float64 array's values (any shape, C order) as f32;
/// errors name the file.
pub fn read_f32(path: &Path) -> Result<Vec<f32>> {
    let at = |what: String| Error::msg(format!("{}: {what}", path.display()));
    let bytes = super::files::read_regular(path, "", super::files::caps::NPY).map_err(Error::msg)?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| at(format!("not a .npy file ({e})")))?;
    if npy.order() != npyz::Order::C {
        return Err(at("Fortran-order arrays are not supported".into()));
    }
    let descr = npy.dtype().descr().trim_matches('\'').to_string();
    match descr.as_str() {
        "<f4" => npy.into_vec::<f32>().map_err(|e| at(e.to_string())),
        "<f8" => Ok(npy.into_vec::<f64>().map_err(|e| at(e.to_string()))?.into_iter().map(|v| v as f32).collect()),
        other => Err(at(format!("dtype {other} is not float32/float64"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, header_descr: &str, fortran: bool, payload: &[u8], n: usize) {
        let dict = format!("{{'descr': '{header_descr}', 'fortran_order': {}, 'shape': ({n},), }}", if fortran { "True" } else { "False" });
        let mut header = dict.into_bytes();
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(b' ');
        }
        header.push(b'\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(payload);
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn reads_f4_and_f8_and_names_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        let f4: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        write(&p, "<f4", false, &f4, 2);
        assert_eq!(read_f32(&p), Ok(vec![1.5, -2.0]));
        let f8: Vec<u8> = [0.25f64, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        write(&p, "<f8", false, &f8, 2);
        assert_eq!(read_f32(&p), Ok(vec![0.25, 3.0]));
        write(&p, "<i4", false, &[0; 8], 2);
        assert_eq!(read_f32(&p).unwrap_err().to_string(), format!("{}: dtype <i4 is not float32/float64", p.display()));
        write(&p, "<f4", true, &f4, 2);
        assert_eq!(read_f32(&p).unwrap_err().to_string(), format!("{}: Fortran-order arrays are not supported", p.display()));
        std::fs::write(&p, b"not numpy").unwrap();
        assert!(read_f32(&p).unwrap_err().to_string().starts_with(&format!("{}: not a .npy file", p.display())));
    }
}
