//! Views of every buffer a backward stage reads or writes, and the metadata the stages load from
//! the workspace (as a GPU kernel loads it into registers).

use crate::error::Result;
use crate::host_buffer::try_filled;
use crate::launch::host::sequence::Sequences;
use crate::launch::host::tensor_view::TensorView;
use crate::launch::BwdKargs;
use crate::problem::{Element, Mode};
use crate::runtime::host::DeviceSlice;
use crate::runtime::DevicePtr;
use crate::workspace::{self, MetadataView};

pub struct BwdContext<E> {
    pub kargs: BwdKargs,
    pub q: TensorView<E>,
    pub k: TensorView<E>,
    pub v: TensorView<E>,
    pub o: TensorView<E>,
    pub d_o: TensorView<E>,
    pub dq: TensorView<E>,
    pub dk: TensorView<E>,
    pub dv: TensorView<E>,
    pub lse: TensorView<f32>,
    pub d: TensorView<f32>,
    pub dq_acc: DeviceSlice<f32>,
    pub sequences: Sequences,
    /// A copy of the workspace's metadata region.
    pub metadata: Vec<u8>,
    /// Host copy of `seqstart_q` (group mode), for dq_acc addressing.
    pub seqstart_q: Option<Vec<i32>>,
}

fn read_i32s(ptr: DevicePtr<i32>, len: usize, field: &str) -> Result<Vec<i32>> {
    let slice = DeviceSlice::<i32>::new(ptr, len, field)?;
    let mut out = try_filled(len, 0, field)?;
    slice.read_into(0, &mut out);
    Ok(out)
}

impl<E: Element> BwdContext<E> {
    /// Builds the views and checks that the workspace was prepared for exactly these sequences.
    pub fn new(kargs: &BwdKargs) -> Result<Self> {
        let s = &kargs.shape;
        let (m, x) = (s.mode, &kargs.extents);
        let layout = &kargs.layout;
        let metadata_slice = DeviceSlice::<u8>::new(kargs.workspace, layout.metadata_bytes, "workspace")?;
        let mut metadata = try_filled(layout.metadata_bytes, 0u8, "workspace")?;
        metadata_slice.read_into(0, &mut metadata);
        let batch = s.batch as usize;
        let (seqstart_q, seqstart_k) = match m {
            Mode::Group => (
                Some(read_i32s(kargs.sequences.seqstart_q, batch + 1, "seqstart_q")?),
                Some(read_i32s(kargs.sequences.seqstart_k, batch + 1, "seqstart_k")?),
            ),
            Mode::Batch => (None, None),
        };
        let expected = workspace::fingerprint(&layout.params, seqstart_q.as_deref(), seqstart_k.as_deref());
        MetadataView::new(layout, &metadata)?.check_prepared_for(expected)?;
        let dq_acc_len = layout.upper_bound_dq_acc_bytes() / 4;
        Ok(BwdContext {
            kargs: *kargs,
            q: TensorView::new(kargs.q, x.q, m, "q")?,
            k: TensorView::new(kargs.k, x.k, m, "k")?,
            v: TensorView::new(kargs.v, x.v, m, "v")?,
            o: TensorView::new(kargs.o, x.o, m, "o")?,
            d_o: TensorView::new(kargs.d_o, x.d_o, m, "d_o")?,
            dq: TensorView::new(kargs.dq, x.dq, m, "dq")?,
            dk: TensorView::new(kargs.dk, x.dk, m, "dk")?,
            dv: TensorView::new(kargs.dv, x.dv, m, "dv")?,
            lse: TensorView::new(kargs.lse, x.lse, m, "lse")?,
            d: TensorView::new(kargs.d, x.d, m, "d")?,
            dq_acc: DeviceSlice::new(
                kargs.workspace.addr().offset(layout.metadata_bytes).cast(),
                dq_acc_len,
                "workspace",
            )?,
            sequences: Sequences::new(s, &kargs.sequences)?,
            metadata,
            seqstart_q,
        })
    }

    pub fn metadata(&self) -> Result<MetadataView<'_>> {
        MetadataView::new(&self.kargs.layout, &self.metadata)
    }
}
