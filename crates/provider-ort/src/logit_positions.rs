//! Logits of chosen positions from graphs that keep only the last one.
//!
//! This project's converter (`scripts/llama_onnx.py`) cuts the hidden
//! states down to the last position (a `Gather` at index `-1` whose output
//! is named `last_position…`) before the final norm and the LM head, so a
//! prefill does not pay the head for every prompt token. Prompt lookup
//! needs the logits after each drafted token, so, when it is on, the
//! graph is loaded with that fixed index turned into an input,
//! [`POSITIONS_INPUT`]: every run feeds `[-1]` (the same computation as
//! before) except the passes over a draft, which feed the positions they
//! need. The edit is made on the model's bytes in memory; the file stays
//! as it is.
//!
//! Only the few fields the edit touches are decoded; everything else,
//! the weights included, is copied as it is.

/// The graph input that says which positions' logits a run gives
/// (int64, `[positions]`, counted from the end when negative).
pub(crate) const POSITIONS_INPUT: &str = "logits_positions";

/// `model` (an ONNX `ModelProto`) with the index of its `last_position`
/// gather read from [`POSITIONS_INPUT`] instead of a constant, and the
/// logits output's shape left open. `None` when the graph has no such
/// gather (it gives every position's logits already, or is of a shape
/// this edit does not know) or the bytes do not parse.
pub(crate) fn expose_positions(model: &[u8]) -> Option<Vec<u8>> {
    let top = fields(model)?;
    let mut graphs = top.iter().filter(|f| f.number == MODEL_GRAPH && f.is_len());
    let graph = graphs.next()?;
    if graphs.next().is_some() {
        return None;
    }
    let new_graph = patch_graph(graph.payload)?;
    let mut out = Vec::with_capacity(model.len() + 64);
    for f in &top {
        if std::ptr::eq(f, graph) {
            put_len(&mut out, MODEL_GRAPH, &new_graph);
        } else {
            out.extend_from_slice(f.raw);
        }
    }
    Some(out)
}

// Field numbers of onnx.proto3 that the edit reads or writes.
const MODEL_GRAPH: u32 = 7;
const GRAPH_NODE: u32 = 1;
const GRAPH_INPUT: u32 = 11;
const GRAPH_OUTPUT: u32 = 12;
const NODE_INPUT: u32 = 1;
const NODE_OUTPUT: u32 = 2;
const NODE_OP_TYPE: u32 = 4;
const VALUE_INFO_NAME: u32 = 1;
const VALUE_INFO_TYPE: u32 = 2;
const TYPE_TENSOR: u32 = 1;
const TENSOR_ELEM_TYPE: u32 = 1;
const TENSOR_SHAPE: u32 = 2;
const SHAPE_DIM: u32 = 1;
const DIM_PARAM: u32 = 2;
/// `TensorProto.DataType.INT64`.
const INT64: u64 = 7;

fn patch_graph(graph: &[u8]) -> Option<Vec<u8>> {
    let fields = fields(graph)?;
    let mut gathers = fields
        .iter()
        .filter(|f| f.number == GRAPH_NODE && f.is_len())
        .filter(|f| is_last_position_gather(f.payload));
    let gather = gathers.next()?;
    if gathers.next().is_some() {
        return None;
    }
    let new_gather = with_second_input(gather.payload, POSITIONS_INPUT)?;
    let logits = fields.iter().find(|f| {
        f.number == GRAPH_OUTPUT && f.is_len() && value_info_name(f.payload) == Some("logits")
    });
    let new_logits = match logits {
        Some(f) => Some(without_shape(f.payload)?),
        None => None,
    };
    let mut out = Vec::with_capacity(graph.len() + 64);
    for f in &fields {
        if std::ptr::eq(f, gather) {
            put_len(&mut out, GRAPH_NODE, &new_gather);
        } else if let (Some(old), Some(new)) = (logits, &new_logits)
            && std::ptr::eq(f, old)
        {
            put_len(&mut out, GRAPH_OUTPUT, new);
        } else {
            out.extend_from_slice(f.raw);
        }
    }
    put_len(&mut out, GRAPH_INPUT, &positions_input());
    Some(out)
}

/// A `Gather` node whose output is the converter's `last_position…`.
fn is_last_position_gather(node: &[u8]) -> bool {
    let Some(fields) = fields(node) else {
        return false;
    };
    fn text<'a>(f: &Field<'a>) -> Option<&'a str> {
        std::str::from_utf8(f.payload).ok()
    }
    fields
        .iter()
        .any(|f| f.number == NODE_OP_TYPE && text(f) == Some("Gather"))
        && fields
            .iter()
            .filter(|f| f.number == NODE_OUTPUT)
            .any(|f| text(f).is_some_and(|o| o.starts_with("last_position")))
}

/// The node with its second input (a gather's indices) renamed.
fn with_second_input(node: &[u8], name: &str) -> Option<Vec<u8>> {
    let fields = fields(node)?;
    let inputs: Vec<&Field<'_>> = fields.iter().filter(|f| f.number == NODE_INPUT).collect();
    if inputs.len() != 2 {
        return None;
    }
    let mut out = Vec::with_capacity(node.len() + name.len());
    for f in &fields {
        if std::ptr::eq(f, inputs[1]) {
            put_len(&mut out, NODE_INPUT, name.as_bytes());
        } else {
            out.extend_from_slice(f.raw);
        }
    }
    Some(out)
}

fn value_info_name(info: &[u8]) -> Option<&str> {
    fields(info)?
        .into_iter()
        .find(|f| f.number == VALUE_INFO_NAME && f.is_len())
        .and_then(|f| std::str::from_utf8(f.payload).ok())
}

/// A tensor `ValueInfoProto` with its element type kept and its shape
/// dropped: the logits of `n` positions no longer match a fixed `1`.
fn without_shape(info: &[u8]) -> Option<Vec<u8>> {
    let parts = fields(info)?;
    let mut out = Vec::with_capacity(info.len());
    for f in &parts {
        if f.number != VALUE_INFO_TYPE {
            out.extend_from_slice(f.raw);
            continue;
        }
        let tensor = fields_of(f.payload, TYPE_TENSOR)?;
        let elem = fields(tensor)?
            .into_iter()
            .find(|t| t.number == TENSOR_ELEM_TYPE && t.wire == WIRE_VARINT)?;
        let mut tensor_type = Vec::new();
        tensor_type.extend_from_slice(elem.raw);
        let mut type_proto = Vec::new();
        put_len(&mut type_proto, TYPE_TENSOR, &tensor_type);
        put_len(&mut out, VALUE_INFO_TYPE, &type_proto);
    }
    Some(out)
}

/// The one field `number` of a message, as a payload.
fn fields_of(message: &[u8], number: u32) -> Option<&[u8]> {
    fields(message)?
        .into_iter()
        .find(|f| f.number == number && f.is_len())
        .map(|f| f.payload)
}

/// The `ValueInfoProto` of [`POSITIONS_INPUT`]: int64, `[positions]`.
fn positions_input() -> Vec<u8> {
    let mut dim = Vec::new();
    put_len(&mut dim, DIM_PARAM, b"positions");
    let mut shape = Vec::new();
    put_len(&mut shape, SHAPE_DIM, &dim);
    let mut tensor = Vec::new();
    put_varint(&mut tensor, u64::from(TENSOR_ELEM_TYPE << 3));
    put_varint(&mut tensor, INT64);
    put_len(&mut tensor, TENSOR_SHAPE, &shape);
    let mut type_proto = Vec::new();
    put_len(&mut type_proto, TYPE_TENSOR, &tensor);
    let mut info = Vec::new();
    put_len(&mut info, VALUE_INFO_NAME, POSITIONS_INPUT.as_bytes());
    put_len(&mut info, VALUE_INFO_TYPE, &type_proto);
    info
}

const WIRE_VARINT: u8 = 0;
const WIRE_I64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_I32: u8 = 5;

/// One field of a protobuf message.
struct Field<'a> {
    number: u32,
    wire: u8,
    /// The value: a length-delimited field's bytes, else the encoded value.
    payload: &'a [u8],
    /// The whole field, tag included, for copying it as it is.
    raw: &'a [u8],
}

impl Field<'_> {
    fn is_len(&self) -> bool {
        self.wire == WIRE_LEN
    }
}

/// The fields of a message in order; `None` where the bytes are not one.
fn fields(buf: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let start = pos;
        let tag = read_varint(buf, &mut pos)?;
        let number = u32::try_from(tag >> 3).ok()?;
        let wire = (tag & 7) as u8;
        let payload = match wire {
            WIRE_VARINT => {
                let from = pos;
                read_varint(buf, &mut pos)?;
                &buf[from..pos]
            }
            WIRE_I64 | WIRE_I32 => {
                let n = if wire == WIRE_I64 { 8 } else { 4 };
                let end = pos.checked_add(n).filter(|&e| e <= buf.len())?;
                let p = &buf[pos..end];
                pos = end;
                p
            }
            WIRE_LEN => {
                let len = usize::try_from(read_varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|&e| e <= buf.len())?;
                let p = &buf[pos..end];
                pos = end;
                p
            }
            // Groups are not used by onnx.proto.
            _ => return None,
        };
        out.push(Field {
            number,
            wire,
            payload,
            raw: &buf[start..pos],
        });
    }
    Some(out)
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_len(out: &mut Vec<u8>, number: u32, payload: &[u8]) {
    put_varint(out, (u64::from(number) << 3) | u64::from(WIRE_LEN));
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> Vec<u8> {
        let mut n = Vec::new();
        for i in inputs {
            put_len(&mut n, NODE_INPUT, i.as_bytes());
        }
        for o in outputs {
            put_len(&mut n, NODE_OUTPUT, o.as_bytes());
        }
        put_len(&mut n, NODE_OP_TYPE, op.as_bytes());
        n
    }

    fn model(nodes: &[Vec<u8>]) -> Vec<u8> {
        let mut graph = Vec::new();
        for n in nodes {
            put_len(&mut graph, GRAPH_NODE, n);
        }
        let mut m = Vec::new();
        // ir_version 8, then the graph.
        put_varint(&mut m, 1 << 3);
        put_varint(&mut m, 8);
        put_len(&mut m, MODEL_GRAPH, &graph);
        m
    }

    #[test]
    fn the_last_position_index_becomes_an_input() {
        let other = node("Gather", &["table", "const_1"], &["embed"]);
        let last = node("Gather", &["h", "const_1"], &["last_position_9"]);
        let patched = expose_positions(&model(&[other.clone(), last])).unwrap();
        let top = fields(&patched).unwrap();
        assert_eq!(top.len(), 2);
        let graph = fields(top[1].payload).unwrap();
        // The other gather keeps the shared constant.
        assert_eq!(graph[0].payload, &other[..]);
        assert_eq!(
            graph[1].payload,
            &node("Gather", &["h", POSITIONS_INPUT], &["last_position_9"])[..]
        );
        assert_eq!(graph[2].number, GRAPH_INPUT);
        assert_eq!(value_info_name(graph[2].payload), Some(POSITIONS_INPUT));
    }

    #[test]
    fn graphs_without_the_gather_or_not_protobuf_are_left_alone() {
        let plain = model(&[node("Gather", &["table", "ids"], &["embed"])]);
        assert!(expose_positions(&plain).is_none());
        assert!(expose_positions(&[0xff, 0xff]).is_none());
    }
}
