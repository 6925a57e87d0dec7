//! A merge call's arguments and their validation into kernel arguments.

use crate::error::{ensure, Result};
use crate::launch::{MergeExtents, MergeKargs};
use crate::problem::merge::{LseBase, StateDtype};
use crate::problem::{check_memory_overlap, Mode, Operand, Tensor};
use crate::runtime::DeviceAddr;

/// The states `o_in [state][head][row][hdim]` and `lse_in [state][head][row]` (fp32) by strides (the
/// batch stride is the state stride), merged into `o_out [head][row][hdim]` and `lse_out [head][row]`
/// (batch strides unused; `lse_out` null: not written).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MergeArgs {
    pub num_states: i64,
    pub num_rows: i64,
    pub nhead: i64,
    pub hdim: i64,
    pub in_dtype: StateDtype,
    pub out_dtype: StateDtype,
    pub lse_base: LseBase,
    pub o_in: Tensor,
    pub lse_in: Tensor,
    pub o_out: Tensor,
    pub lse_out: Tensor,
}

/// Whether `output` is state 0 of `input` exactly: the same first element, the same head and row
/// strides, the same element type. Only then may an output share memory with an input: each (row,
/// head) reads its states before it writes, so merging in place is safe.
fn is_state_zero(output: &Tensor, input: &Tensor, same_type: bool) -> bool {
    same_type
        && !output.ptr.is_null()
        && output.ptr == input.ptr
        && output.head_stride == input.head_stride
        && output.row_stride == input.row_stride
}

/// States 1.. of `input` (`states` of them in all), for the overlap check of an output that is state 0.
fn states_after_first(input: &Tensor, element_bytes: usize) -> Tensor {
    // The extent check has bounded the states' bytes by the address space, so state 1's address exists
    // whenever there is a state 1 (the caller asks only then).
    let first = input.ptr.0 + input.batch_stride as usize * element_bytes;
    Tensor { ptr: DeviceAddr(first), ..*input }
}

impl MergeArgs {
    /// Validates the call into kernel arguments: counts, every tensor's extent, alignment and address
    /// range, and that the outputs share memory with nothing but (exactly) state 0.
    pub fn validate(&self) -> Result<MergeKargs> {
        for (field, value, least) in
            [("num_states", self.num_states, 0), ("num_rows", self.num_rows, 0), ("nhead", self.nhead, 0)]
                .into_iter()
                .chain([("hdim", self.hdim, 1)])
        {
            ensure(value >= least, field, || format!("{value} is less than {least}"))?;
        }
        let (states, rows, heads, d) = (self.num_states, self.num_rows, self.nhead, self.hdim);
        let (in_bytes, out_bytes) = (self.in_dtype.bytes(), self.out_dtype.bytes());
        let o_in = Operand::tensor("o_in", &self.o_in, Mode::Batch, (states, heads, rows, d), in_bytes, false)?;
        let lse_in = Operand::tensor("lse_in", &self.lse_in, Mode::Batch, (states, heads, rows, 1), 4, false)?;
        let o_out = Operand::tensor("o_out", &self.o_out, Mode::Group, (1, heads, rows, d), out_bytes, true)?;
        let lse_out = if self.lse_out.ptr.is_null() {
            None
        } else {
            Some(Operand::tensor("lse_out", &self.lse_out, Mode::Group, (1, heads, rows, 1), 4, true)?)
        };

        // An output that is state 0 exactly is checked against the other states only.
        let in_place_o = is_state_zero(&self.o_out, &self.o_in, self.in_dtype == self.out_dtype);
        let in_place_lse = is_state_zero(&self.lse_out, &self.lse_in, true);
        let others = (states - 1).max(0);
        let mut operands = vec![o_out];
        operands.extend(lse_out);
        operands.push(match in_place_o {
            true if others == 0 => Operand::bytes("o_in", self.o_in.ptr, 0, false),
            true => {
                let o_rest = states_after_first(&self.o_in, in_bytes);
                Operand::tensor("o_in", &o_rest, Mode::Batch, (others, heads, rows, d), in_bytes, false)?
            }
            false => o_in,
        });
        operands.push(match in_place_lse {
            true if others == 0 => Operand::bytes("lse_in", self.lse_in.ptr, 0, false),
            true => {
                let lse_rest = states_after_first(&self.lse_in, 4);
                Operand::tensor("lse_in", &lse_rest, Mode::Batch, (others, heads, rows, 1), 4, false)?
            }
            false => lse_in,
        });
        check_memory_overlap(&operands)?;

        Ok(MergeKargs {
            num_states: states,
            num_rows: rows,
            nhead: heads,
            hdim: d,
            in_dtype: self.in_dtype,
            out_dtype: self.out_dtype,
            lse_base: self.lse_base,
            o_in: self.o_in,
            lse_in: self.lse_in,
            o_out: self.o_out,
            lse_out: self.lse_out,
            extents: MergeExtents {
                o_in: o_in.elements,
                lse_in: lse_in.elements,
                o_out: o_out.elements,
                lse_out: lse_out.map_or(0, |l| l.elements),
            },
        })
    }
}
