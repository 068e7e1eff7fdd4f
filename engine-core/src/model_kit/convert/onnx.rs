//! ONNX models as a converter reads them: the initializers, the nodes with
//! their attributes, and the values of `Constant` nodes, looked up by tensor
//! name the way `onnx.numpy_helper` gives them to the Python converters.
//!
//! The file is memory-mapped and decoded with `prost` from a [`Bytes`] that
//! owns the map, so every `raw_data` field stays a slice of the map: a tensor
//! is copied only when a converter asks for its values, one at a time, and a
//! model is never held twice. Only the protobuf fields a converter needs are
//! declared ([`proto`]); the others are skipped while decoding.
//!
//! An ONNX file is untrusted input. Every initializer and every `Constant`
//! value is checked when the file is opened, so that reading values later
//! cannot fail: a known data type, dims that are non-negative and whose
//! element count matches the bytes present, and its data inside the file
//! (external data is refused: a converter reads one self-contained file).
//! Errors are one line naming the file and the tensor.

use super::super::error::{Error, Result};
use super::super::files;
use bytes::Bytes;
use ndarray::{ArrayD, IxDyn};
use prost::Message;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The protobuf messages of `onnx.proto` (ONNX IR), reduced to the fields a
/// converter reads; field numbers as in `onnx.proto`. prost skips the rest.
pub mod proto {
    use bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ModelProto {
        #[prost(message, optional, tag = "7")]
        pub graph: Option<GraphProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GraphProto {
        #[prost(message, repeated, tag = "1")]
        pub node: Vec<NodeProto>,
        #[prost(message, repeated, tag = "5")]
        pub initializer: Vec<TensorProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeProto {
        #[prost(string, repeated, tag = "1")]
        pub input: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub output: Vec<String>,
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(string, tag = "4")]
        pub op_type: String,
        #[prost(message, repeated, tag = "5")]
        pub attribute: Vec<AttributeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AttributeProto {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(float, tag = "2")]
        pub f: f32,
        #[prost(int64, tag = "3")]
        pub i: i64,
        #[prost(bytes = "bytes", tag = "4")]
        pub s: Bytes,
        #[prost(message, optional, tag = "5")]
        pub t: Option<TensorProto>,
        #[prost(float, repeated, tag = "7")]
        pub floats: Vec<f32>,
        #[prost(int64, repeated, tag = "8")]
        pub ints: Vec<i64>,
        /// `AttributeProto.AttributeType`.
        #[prost(int32, tag = "20")]
        pub r#type: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        #[prost(int64, repeated, tag = "1")]
        pub dims: Vec<i64>,
        /// `TensorProto.DataType`.
        #[prost(int32, tag = "2")]
        pub data_type: i32,
        #[prost(float, repeated, tag = "4")]
        pub float_data: Vec<f32>,
        #[prost(int32, repeated, tag = "5")]
        pub int32_data: Vec<i32>,
        #[prost(int64, repeated, tag = "7")]
        pub int64_data: Vec<i64>,
        #[prost(string, tag = "8")]
        pub name: String,
        #[prost(bytes = "bytes", optional, tag = "9")]
        pub raw_data: Option<Bytes>,
        #[prost(double, repeated, tag = "10")]
        pub double_data: Vec<f64>,
        #[prost(message, repeated, tag = "13")]
        pub external_data: Vec<StringStringEntryProto>,
        /// `TensorProto.DataLocation`: 0 default, 1 external.
        #[prost(int32, tag = "14")]
        pub data_location: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StringStringEntryProto {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }
}

/// Protobuf messages cannot exceed 2 GiB, so a larger `.onnx` keeps its
/// weights in external files, which a converter refuses anyway.
pub const MAX_ONNX_BYTES: u64 = 2 << 30;

/// The element types a converter reads (`TensorProto.DataType`); others are
/// refused when the file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    Float,
    Uint8,
    Int8,
    Uint16,
    Int16,
    Int32,
    Int64,
    Bool,
    Float16,
    Double,
    Uint32,
    Uint64,
    Bfloat16,
}

impl DataType {
    fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            1 => DataType::Float,
            2 => DataType::Uint8,
            3 => DataType::Int8,
            4 => DataType::Uint16,
            5 => DataType::Int16,
            6 => DataType::Int32,
            7 => DataType::Int64,
            9 => DataType::Bool,
            10 => DataType::Float16,
            11 => DataType::Double,
            12 => DataType::Uint32,
            13 => DataType::Uint64,
            16 => DataType::Bfloat16,
            _ => return None,
        })
    }

    /// The name `onnx.proto` gives a data type code, for errors.
    fn code_name(code: i32) -> &'static str {
        const NAMES: [&str; 29] = [
            "UNDEFINED",
            "FLOAT",
            "UINT8",
            "INT8",
            "UINT16",
            "INT16",
            "INT32",
            "INT64",
            "STRING",
            "BOOL",
            "FLOAT16",
            "DOUBLE",
            "UINT32",
            "UINT64",
            "COMPLEX64",
            "COMPLEX128",
            "BFLOAT16",
            "FLOAT8E4M3FN",
            "FLOAT8E4M3FNUZ",
            "FLOAT8E5M2",
            "FLOAT8E5M2FNUZ",
            "UINT4",
            "INT4",
            "FLOAT4E2M1",
            "FLOAT8E8M0",
            "UINT2",
            "INT2",
            "FLOAT6E2M3",
            "FLOAT6E3M2",
        ];
        usize::try_from(code).ok().and_then(|i| NAMES.get(i)).copied().unwrap_or("unknown")
    }

    /// Bytes per element in `raw_data`.
    pub fn size(self) -> usize {
        match self {
            DataType::Uint8 | DataType::Int8 | DataType::Bool => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Float | DataType::Int32 | DataType::Uint32 => 4,
            DataType::Int64 | DataType::Double | DataType::Uint64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DataType::Float | DataType::Float16 | DataType::Bfloat16 | DataType::Double)
    }
}

/// Where a tensor's elements are: `raw_data` (little-endian, as every exporter
/// writes weights) or one of the typed fields.
#[derive(Clone, Debug)]
enum Data {
    Raw(Bytes),
    Floats(Vec<f32>),
    /// INT32 and the narrower types (one element per entry; FLOAT16/BFLOAT16 as bit patterns).
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Doubles(Vec<f64>),
}

/// One checked tensor: an initializer or a `Constant` node's value.
#[derive(Clone, Debug)]
pub struct OnnxTensor {
    name: String,
    dims: Vec<usize>,
    data_type: DataType,
    len: usize,
    data: Data,
}

impl OnnxTensor {
    /// Checks `t` (read from `file`; `what` names it when it has no name of
    /// its own, e.g. "the value of Constant node /x/Constant").
    fn checked(file: &Path, t: proto::TensorProto, what: &str) -> Result<Self> {
        let shown = if t.name.is_empty() { what.to_string() } else { format!("tensor {}", t.name) };
        let fail = |reason: String| Error::msg(format!("{}: {shown} {reason}", file.display()));
        if t.data_location == 1 || !t.external_data.is_empty() {
            return Err(fail(
                "keeps its data in an external file; convert a self-contained .onnx (weights inside the file, as the official bundles ship them)".into(),
            ));
        }
        let Some(data_type) = DataType::from_code(t.data_type) else {
            return Err(fail(format!("has data type {} ({}), which a converter does not read", t.data_type, DataType::code_name(t.data_type))));
        };
        let mut dims = Vec::with_capacity(t.dims.len());
        let mut len = 1usize;
        for &d in &t.dims {
            let d = usize::try_from(d).map_err(|_| fail(format!("has a negative dimension in dims {:?}", t.dims)))?;
            len = len.checked_mul(d).ok_or_else(|| fail(format!("has dims {:?}, more elements than memory can hold", t.dims)))?;
            dims.push(d);
        }
        let (data, present, unit) = match t.raw_data {
            Some(raw) => {
                let present = raw.len();
                let need = len.checked_mul(data_type.size());
                if need != Some(present) {
                    return Err(fail(format!(
                        "has dims {:?} of {}: {} bytes of raw_data needed, {present} present",
                        t.dims,
                        DataType::code_name(t.data_type),
                        need.map_or_else(|| "more".to_string(), |n| n.to_string())
                    )));
                }
                (Data::Raw(raw), present, "bytes of raw_data")
            }
            None => match data_type {
                DataType::Float => (Data::Floats(t.float_data), 0, "float_data values"),
                DataType::Double => (Data::Doubles(t.double_data), 0, "double_data values"),
                DataType::Int64 => (Data::Int64(t.int64_data), 0, "int64_data values"),
                DataType::Uint32 | DataType::Uint64 => {
                    return Err(fail(format!("stores {} in uint64_data, which a converter does not read", DataType::code_name(t.data_type))));
                }
                _ => (Data::Int32(t.int32_data), 0, "int32_data values"),
            },
        };
        let present = match &data {
            Data::Raw(_) => present,
            Data::Floats(v) => v.len(),
            Data::Doubles(v) => v.len(),
            Data::Int64(v) => v.len(),
            Data::Int32(v) => v.len(),
        };
        if !matches!(data, Data::Raw(_)) && present != len {
            return Err(fail(format!("has dims {:?} ({len} elements) but {present} {unit}", t.dims)));
        }
        Ok(OnnxTensor { name: t.name, dims, data_type, len, data })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shape, outermost first (numpy order); empty for a scalar.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    pub fn data_type(&self) -> DataType {
        self.data_type
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element `i` as f64 (exact for every type but 64-bit integers beyond 2^53,
    /// which round as Python's `float(int)` does).
    fn element_f64(&self, i: usize) -> f64 {
        match &self.data {
            Data::Raw(raw) => {
                let size = self.data_type.size();
                let b = &raw[i * size..(i + 1) * size];
                match self.data_type {
                    DataType::Float => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                    DataType::Double => f64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
                    DataType::Float16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
                    DataType::Bfloat16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
                    _ => self.element_i128(i) as f64,
                }
            }
            Data::Floats(v) => v[i] as f64,
            Data::Doubles(v) => v[i],
            Data::Int64(v) => v[i] as f64,
            Data::Int32(v) => match self.data_type {
                DataType::Float16 => half::f16::from_bits(v[i] as u16).to_f64(),
                DataType::Bfloat16 => half::bf16::from_bits(v[i] as u16).to_f64(),
                _ => self.element_i128(i) as f64,
            },
        }
    }

    /// Element `i` of an integer or bool tensor, widened so every type fits.
    fn element_i128(&self, i: usize) -> i128 {
        match &self.data {
            Data::Raw(raw) => {
                let size = self.data_type.size();
                let b = &raw[i * size..(i + 1) * size];
                match self.data_type {
                    DataType::Uint8 | DataType::Bool => b[0] as i128,
                    DataType::Int8 => b[0] as i8 as i128,
                    DataType::Uint16 => u16::from_le_bytes([b[0], b[1]]) as i128,
                    DataType::Int16 => i16::from_le_bytes([b[0], b[1]]) as i128,
                    DataType::Int32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i128,
                    DataType::Uint32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i128,
                    DataType::Int64 => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as i128,
                    DataType::Uint64 => u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as i128,
                    _ => self.element_f64(i) as i128,
                }
            }
            Data::Int64(v) => v[i] as i128,
            Data::Int32(v) => match self.data_type {
                // The narrow types keep their value in the low bits of each int32.
                DataType::Uint8 => v[i] as u8 as i128,
                DataType::Int8 => v[i] as i8 as i128,
                DataType::Uint16 => v[i] as u16 as i128,
                DataType::Int16 => v[i] as i16 as i128,
                DataType::Bool => (v[i] != 0) as i128,
                DataType::Float16 | DataType::Bfloat16 => self.element_f64(i) as i128,
                _ => v[i] as i128,
            },
            Data::Floats(v) => v[i] as i128,
            Data::Doubles(v) => v[i] as i128,
        }
    }

    fn shaped<T>(&self, values: Vec<T>) -> ArrayD<T> {
        // The element count was checked against dims when the file was opened.
        ArrayD::from_shape_vec(IxDyn(&self.dims), values).unwrap_or_else(|_| unreachable!("element count checked at open"))
    }

    /// The values as float32, as numpy's `astype(np.float32)` gives them
    /// (float64 rounded to nearest, integers converted).
    pub fn to_f32(&self) -> ArrayD<f32> {
        let values: Vec<f32> = match (&self.data, self.data_type) {
            (Data::Raw(raw), DataType::Float) => raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            (Data::Floats(v), _) => v.clone(),
            (_, t) if t.is_float() => (0..self.len).map(|i| self.element_f64(i) as f32).collect(),
            _ => (0..self.len).map(|i| self.element_i128(i) as f32).collect(),
        };
        self.shaped(values)
    }

    /// The values as float64 (exact for every float type).
    pub fn to_f64(&self) -> ArrayD<f64> {
        let values = (0..self.len).map(|i| self.element_f64(i)).collect();
        self.shaped(values)
    }

    /// The values of an integer or bool tensor as int64 (`None` for a float
    /// tensor, or a UINT64 value beyond int64).
    pub fn to_i64(&self) -> Option<ArrayD<i64>> {
        if self.data_type.is_float() {
            return None;
        }
        let values = (0..self.len).map(|i| i64::try_from(self.element_i128(i)).ok()).collect::<Option<Vec<i64>>>()?;
        Some(self.shaped(values))
    }

    /// The one element of a one-element tensor as f64 (Python's
    /// `float(v.reshape(-1)[0])` where `v.size == 1`), else `None`.
    pub fn scalar(&self) -> Option<f64> {
        (self.len == 1).then(|| self.element_f64(0))
    }
}

/// A node attribute, by its declared type (`AttributeProto.type`), as
/// `onnx.helper.get_attribute_value` reads it.
#[derive(Clone, Debug)]
pub enum AttributeValue {
    Float(f32),
    Int(i64),
    String(Bytes),
    Tensor(Box<OnnxTensor>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    /// Graphs, sparse tensors, type protos, lists of those: not read by converters.
    Unread(i32),
}

#[derive(Clone, Debug)]
pub struct OnnxAttribute {
    pub name: String,
    pub value: AttributeValue,
}

/// One graph node.
#[derive(Clone, Debug)]
pub struct OnnxNode {
    pub name: String,
    pub op_type: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<OnnxAttribute>,
}

impl OnnxNode {
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes.iter().find(|a| a.name == name).map(|a| &a.value)
    }

    /// A FLOAT attribute.
    pub fn float_attribute(&self, name: &str) -> Option<f32> {
        match self.attribute(name)? {
            AttributeValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// An INTS attribute.
    pub fn ints_attribute(&self, name: &str) -> Option<&[i64]> {
        match self.attribute(name)? {
            AttributeValue::Ints(v) => Some(v),
            _ => None,
        }
    }
}

/// The memory map a graph's [`Bytes`] borrow from, shared with the graph so
/// it can give pages back ([`OnnxGraph::release`]).
struct SharedMap(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// One ONNX model's main graph, indexed by tensor name.
pub struct OnnxGraph {
    path: PathBuf,
    /// The file's map, when the graph was opened from a file.
    map: Option<Arc<memmap2::Mmap>>,
    nodes: Vec<OnnxNode>,
    initializers: Vec<String>,
    /// Initializers, then `Constant` outputs (a later one replaces an earlier one of the same name).
    values: HashMap<String, OnnxTensor>,
    producer: HashMap<String, usize>,
    consumers: HashMap<String, Vec<usize>>,
}

impl OnnxGraph {
    /// Maps and decodes `path`, checking every initializer and `Constant`
    /// value (see the module doc).
    pub fn open(path: &Path) -> Result<Self> {
        let file = files::open_regular(path, "ONNX model", MAX_ONNX_BYTES)?;
        // SAFETY: the map is read-only and private to this process; as with
        // every mmap, a file truncated by another process while mapped would
        // fault, which is the same hazard every mmap-based model loader takes.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::msg(format!("{}: cannot map: {e}", path.display())))?;
        let map = Arc::new(map);
        let mut graph = Self::decode(path, Bytes::from_owner(SharedMap(map.clone())))?;
        // Decoding touched a page or so around every field header (the
        // kernel maps pages around each fault), a third of a large model:
        // give them back; each tensor's pages come back when it is read.
        // SAFETY: as in `release`: a read-only private map of a file.
        let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        graph.map = Some(map);
        Ok(graph)
    }

    /// Gives back the memory of tensor `name`'s bytes in the file map (the
    /// whole pages inside them): a converter that has read a tensor calls
    /// this, so that reading a model tensor by tensor keeps only the tensor
    /// in hand resident, not every page of the file read so far. Reading the
    /// tensor again later reads it from the file again. A hint: nothing
    /// happens for a graph decoded from memory or a tensor not in `raw_data`.
    pub fn release(&self, name: &str) {
        let (Some(map), Some(OnnxTensor { data: Data::Raw(raw), .. })) = (&self.map, self.values.get(name)) else {
            return;
        };
        let base = map.as_ptr() as usize;
        let Some(start) = (raw.as_ptr() as usize).checked_sub(base) else {
            return;
        };
        let page = page_size();
        let first = start.div_ceil(page) * page;
        let end = ((start + raw.len()).min(map.len()) / page) * page;
        if end > first {
            // SAFETY: the map is a read-only private mapping of a file that
            // nothing in this process writes: dropping its pages only makes
            // the next read fault them in from the file again, so every
            // `Bytes` borrowing them still reads the same values.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first) };
        }
    }

    /// Decodes an ONNX model image (`path` names it in errors).
    pub fn decode(path: &Path, image: Bytes) -> Result<Self> {
        let model = proto::ModelProto::decode(image).map_err(|e| Error::msg(format!("{}: not a readable ONNX model ({e})", path.display())))?;
        let graph = model.graph.ok_or_else(|| Error::msg(format!("{}: not an ONNX model (no graph)", path.display())))?;
        let mut values = HashMap::new();
        let mut initializers = Vec::with_capacity(graph.initializer.len());
        for t in graph.initializer {
            let tensor = OnnxTensor::checked(path, t, "an unnamed initializer")?;
            initializers.push(tensor.name.clone());
            values.insert(tensor.name.clone(), tensor);
        }
        let mut nodes = Vec::with_capacity(graph.node.len());
        let mut producer = HashMap::new();
        let mut consumers: HashMap<String, Vec<usize>> = HashMap::new();
        for (index, n) in graph.node.into_iter().enumerate() {
            let shown_node = |n: &proto::NodeProto| format!("{} node {}", n.op_type, if n.name.is_empty() { "(unnamed)" } else { n.name.as_str() });
            let mut attributes = Vec::with_capacity(n.attribute.len());
            for a in &n.attribute {
                let value = match a.r#type {
                    1 => AttributeValue::Float(a.f),
                    2 => AttributeValue::Int(a.i),
                    3 => AttributeValue::String(a.s.clone()),
                    4 => {
                        let t = a.t.clone().ok_or_else(|| {
                            Error::msg(format!("{}: attribute {} of {} declares a tensor but holds none", path.display(), a.name, shown_node(&n)))
                        })?;
                        let what = format!("attribute {} of {}", a.name, shown_node(&n));
                        AttributeValue::Tensor(Box::new(OnnxTensor::checked(path, t, &what)?))
                    }
                    6 => AttributeValue::Floats(a.floats.clone()),
                    7 => AttributeValue::Ints(a.ints.clone()),
                    other => AttributeValue::Unread(other),
                };
                attributes.push(OnnxAttribute { name: a.name.clone(), value });
            }
            let node = OnnxNode { name: n.name, op_type: n.op_type, inputs: n.input, outputs: n.output, attributes };
            if node.op_type == "Constant" {
                // The tensor form only, as the converters read Constants.
                if let (Some(AttributeValue::Tensor(t)), Some(out)) = (node.attribute("value"), node.outputs.first()) {
                    values.insert(out.clone(), (**t).clone());
                }
            }
            for o in &node.outputs {
                producer.insert(o.clone(), index);
            }
            for i in &node.inputs {
                consumers.entry(i.clone()).or_default().push(index);
            }
            nodes.push(node);
        }
        Ok(OnnxGraph { path: path.to_path_buf(), map: None, nodes, initializers, values, producer, consumers })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name alone (`text_encoder.onnx`), as converter errors name a graph.
    pub fn file_name(&self) -> String {
        self.path.file_name().map_or_else(|| self.path.display().to_string(), |n| n.to_string_lossy().into_owned())
    }

    /// Initializer names in file order.
    pub fn initializer_names(&self) -> &[String] {
        &self.initializers
    }

    /// An initializer or a `Constant` node's output.
    pub fn value(&self, name: &str) -> Option<&OnnxTensor> {
        self.values.get(name)
    }

    pub fn contains_value(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// [`OnnxTensor::scalar`] of the value `name`.
    pub fn scalar(&self, name: &str) -> Option<f64> {
        self.value(name)?.scalar()
    }

    /// Nodes in file order (the graph's topological order for a valid model).
    pub fn nodes(&self) -> &[OnnxNode] {
        &self.nodes
    }

    /// The node whose output is `name` (the last one, should several claim it).
    pub fn producer(&self, name: &str) -> Option<&OnnxNode> {
        self.producer.get(name).map(|&i| &self.nodes[i])
    }

    /// The nodes that read `name`, in file order (a node reading it twice twice).
    pub fn consumers(&self, name: &str) -> impl Iterator<Item = &OnnxNode> {
        self.consumers.get(name).into_iter().flatten().map(|&i| &self.nodes[i])
    }

    /// The first consumer of `name` with operator `op_type`.
    pub fn consumer(&self, name: &str, op_type: &str) -> Option<&OnnxNode> {
        self.consumers(name).find(|n| n.op_type == op_type)
    }
}

/// The system's page size (4096 where it cannot be read).
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}
