//! Stage 2: one work unit = one (batch, kv head, K tile). K/V stay resident while the q tiles of every
//! query head of the GQA group stream past: P is recomputed from LSE, dV and dK accumulate in f32,
//! dQ partials go to dq_acc. Three schemes:
//! - non-deterministic: one block per unit, atomic dq_acc adds;
//! - deterministic, split slots (CK's, the AMD kernels'): the persistent schedule of `schedule.rs`, one
//!   workgroup per CU walking its range, each split slot written by exactly one CU. There the CU's first
//!   unit in a slot writes all of it (its partial, zeros on the rows it does not visit), so that no pass
//!   zeroes the slots beforehand; its later units add;
//! - deterministic, ordered (the NVIDIA kernel's, `launch::dq_order`): one block per (batch, kv
//!   head) runs its units in the kernel's launch order, adding into the one dq_acc; each q tile's turn
//!   counter (the kernel's semaphore, here in memory of the run's own) must show the unit's turn, so a
//!   turn or semaphore index that disagrees with the units' walks is an error, not a different sum.

use super::BwdContext;
use crate::error::{Error, Result};
use crate::launch::dq_order::{dq_write_turn, rotated_walks, rotated_write_turn};
use crate::launch::host::grid::for_each_block;
use crate::launch::host::sequence::BatchRows;
use crate::launch::host::tile_math::{axpy, dot, scale};
use crate::problem::{Element, Mode, ResolvedMask};
use crate::schedule::{ceil_div, group_jobs, BatchPersistent, WorkUnit};
use crate::workspace::{DqAccBlock, MetadataView};
use std::sync::atomic::{AtomicI32, AtomicI64, Ordering};

/// How a unit's dQ partial reaches dq_acc.
enum DqWrite<'a> {
    /// Any order: atomic adds (non-deterministic mode).
    Atomic,
    /// The slot belongs to this CU alone: plain stores in its first unit there, read-add-write after,
    /// in the CU's fixed unit order. The owner table turns a schedule bug (two CUs on one slot, or a
    /// slot's first unit not marked first) into an error instead of a silent race.
    Owned { cu: i64, owners: &'a SlotOwners },
    /// The one dq_acc, in turn: `turns` counts each q tile's writers so far (indexed as the kernel's
    /// semaphores, `WorkspaceLayout::dq_semaphore`).
    Ordered { turns: &'a [AtomicI32] },
}

/// First CU to touch each (batch, kv head, split) slot.
pub struct SlotOwners {
    owner: Vec<AtomicI64>,
    heads: usize,
    splits: usize,
}

impl SlotOwners {
    fn new(batch: usize, heads: usize, splits: usize) -> SlotOwners {
        SlotOwners { owner: (0..batch * heads * splits).map(|_| AtomicI64::new(-1)).collect(), heads, splits }
    }

    fn claim(&self, unit: &WorkUnit, cu: i64) -> Result<()> {
        let slot = (unit.batch as usize * self.heads + unit.head as usize) * self.splits + unit.split as usize;
        let cell = self.owner.get(slot).ok_or_else(|| {
            Error::internal(format!("deterministic schedule: split {} out of range {}", unit.split, self.splits))
        })?;
        let first = cell.compare_exchange(-1, cu, Ordering::Relaxed, Ordering::Relaxed);
        if first.is_ok() != unit.first_in_slot {
            return Err(Error::internal(format!("deterministic schedule: first_in_slot of {unit:?} is wrong")));
        }
        match first {
            Ok(_) => Ok(()),
            Err(other) if other == cu => Ok(()),
            Err(other) => Err(Error::internal(format!(
                "deterministic schedule gave dq_acc slot (batch {}, head {}, split {}) to CUs {other} and {cu}",
                unit.batch, unit.head, unit.split
            ))),
        }
    }
}

pub fn run<E: Element>(c: &BwdContext<E>, workers: i64) -> Result<()> {
    let s = &c.kargs.shape;
    let (n0, masked) = (c.kargs.instance.n0, s.masked());
    let meta = c.metadata()?;
    let heads = s.nhead_k;
    let num_cus = c.kargs.layout.params.num_cus;
    if !c.kargs.deterministic {
        let tiles = (s.max_seqlen_k + n0 - 1) / n0; // no keys: no units (dK, dV have no rows)
        let blocks = (tiles * heads * s.batch) as usize;
        return for_each_block(blocks, workers, |block| {
            let block = block as i64;
            let unit = WorkUnit {
                batch: block / (tiles * heads),
                head: (block / tiles) % heads,
                k_tile: block % tiles,
                split: 0,
                first_in_slot: false,
            };
            run_unit(c, &meta, &unit, DqWrite::Atomic)
        });
    }
    let layout = &c.kargs.layout;
    if layout.params.ordered_dq {
        let tiles = ceil_div(s.max_seqlen_k, n0);
        let turns: Vec<AtomicI32> = (0..layout.dq_semaphore_words).map(|_| AtomicI32::new(0)).collect();
        let write = DqWrite::Ordered { turns: &turns };
        return for_each_block((s.batch * heads) as usize, workers, |block| {
            let (batch, head) = (block as i64 / heads, block as i64 % heads);
            // The kernel's launch order: K tiles first to last, masked last to first.
            let order: Vec<i64> = if masked { (0..tiles).rev().collect() } else { (0..tiles).collect() };
            let mut runs = Vec::new();
            for k_tile in order {
                let unit = WorkUnit { batch, head, k_tile, split: 0, first_in_slot: false };
                runs.extend(UnitRun::new(c, &meta, unit, &write)?);
            }
            // Rotated walks (unmasked, every unit resident): in lockstep, unit n at step (tick + n) mod
            // steps, as the kernel's units reach their tiles; otherwise each unit walks in turn.
            let steps = runs.first().map_or(0, |r| r.steps());
            let k_tiles = runs.len() as i64;
            if rotated_walks(masked, k_tiles, steps, num_cus) {
                for tick in 0..steps {
                    for run in &mut runs {
                        let step = (tick + run.unit.k_tile) % steps;
                        run.step(step, Some(rotated_write_turn(k_tiles, run.unit.k_tile, step)), &write)?;
                    }
                }
            } else {
                for run in &mut runs {
                    for step in 0..run.steps() {
                        run.step(step, None, &write)?;
                    }
                }
            }
            runs.into_iter().for_each(UnitRun::finish);
            Ok(())
        });
    }
    let max_splits = ((s.max_seqlen_k + n0 - 1) / n0).max(1) as usize;
    let owners = SlotOwners::new(s.batch as usize, heads as usize, max_splits);
    match s.mode {
        Mode::Batch => {
            let plan = BatchPersistent::new(s.batch, heads, s.seqlen_k, n0, num_cus)?;
            for_each_block(num_cus as usize, workers, |cu| {
                for unit in plan.jobs(cu as i64, masked) {
                    run_unit(c, &meta, &unit, DqWrite::Owned { cu: cu as i64, owners: &owners })?;
                }
                Ok(())
            })
        }
        Mode::Group => {
            let batch_states = meta.batch_states();
            for_each_block(num_cus as usize, workers, |cu| {
                let state = meta.cu_state(cu);
                for unit in group_jobs(&state, &batch_states, heads, masked) {
                    run_unit(c, &meta, &unit, DqWrite::Owned { cu: cu as i64, owners: &owners })?;
                }
                Ok(())
            })
        }
    }
}

/// The ordered scheme's turn check for the unit's q tile `q_tile` of query head `head`: the tile's counter
/// must hold the unit's turn (`rotated_turn` for rotated walks, else `dq_write_turn`'s): every earlier
/// writer has added, no later one has. Returns the counter to advance once the unit's adds are done.
#[allow(clippy::too_many_arguments)]
fn take_turn<'a, E: Element>(
    c: &BwdContext<E>,
    turns: &'a [AtomicI32],
    mask: &ResolvedMask,
    unit: &WorkUnit,
    q_start: i64,
    head: i64,
    q_tile: i64,
    rotated_turn: Option<i64>,
) -> Result<&'a AtomicI32> {
    let (layout, instance) = (&c.kargs.layout, &c.kargs.instance);
    let index = layout.dq_semaphore(unit.batch, q_start, head, q_tile);
    let counter = turns.get(index).ok_or_else(|| {
        Error::internal(format!("ordered dQ: semaphore {index} of q tile {q_tile} (head {head}) past {}", turns.len()))
    })?;
    let turn = rotated_turn
        .unwrap_or_else(|| dq_write_turn(mask, c.kargs.shape.masked(), instance.m0, instance.n0, unit.k_tile, q_tile));
    let seen = i64::from(counter.load(Ordering::Acquire));
    if seen != turn {
        return Err(Error::internal(format!(
            "ordered dQ: {unit:?} has turn {turn} at q tile {q_tile} of head {head}, whose semaphore {index} shows {seen}"
        )));
    }
    Ok(counter)
}

/// Per-unit scratch rows, f32.
struct Tile {
    width: usize,
    data: Vec<f32>,
}

impl Tile {
    fn new(rows: usize, width: usize) -> Tile {
        Tile { width, data: vec![0.0; rows * width] }
    }
    fn rows(&self) -> usize {
        self.data.len() / self.width.max(1)
    }
    fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.width..(i + 1) * self.width]
    }
    fn row_mut(&mut self, i: usize) -> &mut [f32] {
        &mut self.data[i * self.width..(i + 1) * self.width]
    }
}

fn run_unit<E: Element>(c: &BwdContext<E>, meta: &MetadataView<'_>, unit: &WorkUnit, write: DqWrite<'_>) -> Result<()> {
    if let Some(mut run) = UnitRun::new(c, meta, *unit, &write)? {
        for step in 0..run.steps() {
            run.step(step, None, &write)?;
        }
        run.finish();
    }
    Ok(())
}

/// One unit on its way: K and V loaded, dK and dV accumulating over the steps of its walk, each step one
/// q tile of one query head of the group (`step`; the ordered scheme's rotated walks interleave the
/// units of a (batch, kv head)), stored by `finish`.
struct UnitRun<'c, E: Element> {
    c: &'c BwdContext<E>,
    unit: WorkUnit,
    rows: BatchRows,
    mask: ResolvedMask,
    acc: DqAccBlock,
    store_first: bool,
    j0: i64,
    /// The q tiles' rows: [i_start, i_hi) of every query head, in m0-aligned tiles.
    i_start: i64,
    i_hi: i64,
    k_tile: Tile,
    v_tile: Tile,
    dk_acc: Tile,
    dv_acc: Tile,
    q_tile: Tile,
    do_tile: Tile,
    dq_part: Tile,
    lse: Vec<f32>,
    big_d: Vec<f32>,
    staging: Vec<E>,
}

impl<'c, E: Element> UnitRun<'c, E> {
    /// The unit with K and V loaded; `None` for a K tile past its batch's keys (after a split slot's
    /// first unit has zeroed the rows it owns).
    fn new(c: &'c BwdContext<E>, meta: &MetadataView<'_>, unit: WorkUnit, write: &DqWrite<'_>) -> Result<Option<Self>> {
        let s = &c.kargs.shape;
        let (m0, n0) = (c.kargs.instance.m0, c.kargs.instance.n0);
        let (b, hk) = (unit.batch, unit.head);
        let rows = c.sequences.rows(b as usize)?;
        let j0 = unit.k_tile * n0;
        let store_first = match write {
            DqWrite::Owned { cu, owners } => {
                owners.claim(&unit, *cu)?;
                unit.first_in_slot
            }
            DqWrite::Atomic | DqWrite::Ordered { .. } => false,
        };
        let mask = s.mask.resolve(rows.sq, rows.sk);
        let (i_lo, i_hi) = if rows.sk <= j0 {
            (0, 0)
        } else if s.masked() {
            mask.query_range(j0, (j0 + n0).min(rows.sk))
        } else {
            (0, rows.sq)
        };
        // q tiles aligned to m0, as the GPU kernel iterates them: rows [i_start, i_hi) of every query head.
        let i_start = if i_lo < i_hi { i_lo / m0 * m0 } else { i_hi };
        let acc: DqAccBlock = c.kargs.layout.dq_acc_block(meta, c.seqstart_q.as_deref(), b as usize)?;
        if store_first {
            // The rows this unit does not visit, every query head's columns: zeros.
            let zeros = vec![0f32; acc.hdim];
            for i in (0..i_start).chain(i_hi..rows.sq) {
                c.dq_acc.write_from(acc.index(hk as usize, unit.split as usize, i as usize, 0), &zeros);
            }
        }
        if rows.sk <= j0 {
            return Ok(None); // tile beyond this batch's keys (padding or a shorter batch)
        }
        let n = ((j0 + n0).min(rows.sk) - j0) as usize;
        let (dq, dv, m0u) = (s.hdim_q as usize, s.hdim_v as usize, m0 as usize);
        let mut staging = Vec::new();
        let (mut k_tile, mut v_tile) = (Tile::new(n, dq), Tile::new(n, dv));
        for j in 0..n {
            let row = rows.k_start + j0 + j as i64;
            c.k.read_row(b, hk, row, k_tile.row_mut(j), &mut staging);
            c.v.read_row(b, hk, row, v_tile.row_mut(j), &mut staging);
        }
        Ok(Some(UnitRun {
            c,
            unit,
            rows,
            mask,
            acc,
            store_first,
            j0,
            i_start,
            i_hi,
            k_tile,
            v_tile,
            dk_acc: Tile::new(n, dq),
            dv_acc: Tile::new(n, dv),
            q_tile: Tile::new(m0u, dq),
            do_tile: Tile::new(m0u, dv),
            dq_part: Tile::new(m0u, dq),
            lse: vec![0f32; m0u],
            big_d: vec![0f32; m0u],
            staging,
        }))
    }

    /// q tiles per query head.
    fn tiles_per_head(&self) -> i64 {
        ceil_div(self.i_hi - self.i_start, self.c.kargs.instance.m0)
    }

    /// Steps of the walk: the q tiles of every query head of the group.
    fn steps(&self) -> i64 {
        self.tiles_per_head() * self.c.kargs.shape.group_size()
    }

    /// Step `step` of the unrotated walk (query head major), its dQ partial added as `write` says
    /// (`rotated_turn`: the ordered scheme's turn where the walks are rotated).
    fn step(&mut self, step: i64, rotated_turn: Option<i64>, write: &DqWrite<'_>) -> Result<()> {
        let c = self.c;
        let s = &c.kargs.shape;
        let m0 = c.kargs.instance.m0;
        let (b, hk, rows, j0) = (self.unit.batch, self.unit.head, self.rows, self.j0);
        let (n, dq) = (self.k_tile.rows(), s.hdim_q as usize);
        let g = step / self.tiles_per_head();
        let h = hk * s.group_size() + g;
        let i0 = self.i_start + step % self.tiles_per_head() * m0;
        let i1 = (i0 + m0).min(self.i_hi);
        let m = (i1 - i0) as usize;
        for i in 0..m {
            let row = rows.q_start + i0 + i as i64;
            c.q.read_row(b, h, row, self.q_tile.row_mut(i), &mut self.staging);
            c.d_o.read_row(b, h, row, self.do_tile.row_mut(i), &mut self.staging);
            let l = c.lse.slice().get(c.lse.row_offset(b, h, row));
            // A fully masked row has LSE = -inf; using 0 keeps P = 0 instead of NaN.
            self.lse[i] = if l == f32::NEG_INFINITY { 0.0 } else { l };
            self.big_d[i] = c.d.slice().get(c.d.row_offset(b, h, row));
        }
        let mask = &self.mask;
        let edge = s.masked() && mask.tile_needs_mask(i0, i1, j0, j0 + n as i64);
        let turn = match write {
            DqWrite::Ordered { turns } => {
                Some(take_turn(c, turns, mask, &self.unit, rows.q_start, h, i0 / m0, rotated_turn)?)
            }
            _ => None,
        };
        let dtype = E::DTYPE;
        for i in 0..m {
            let qi = self.q_tile.row(i);
            let gi = self.do_tile.row(i);
            let dq_i = &mut self.dq_part.data[i * dq..(i + 1) * dq];
            dq_i.fill(0.0);
            for j in 0..n {
                if edge && !mask.is_kept(i0 + i as i64, j0 + j as i64) {
                    continue; // P = 0: no contribution anywhere
                }
                let p = (dot(qi, self.k_tile.row(j)) * s.scale - self.lse[i]).exp();
                axpy(dtype.round(p), gi, self.dv_acc.row_mut(j));
                let dp = dot(gi, self.v_tile.row(j));
                let ds = dtype.round(p * (dp - self.big_d[i]));
                axpy(ds, qi, self.dk_acc.row_mut(j));
                axpy(ds, self.k_tile.row(j), dq_i);
            }
            scale(s.scale, dq_i);
            let start =
                self.acc.index(hk as usize, self.unit.split as usize, (i0 + i as i64) as usize, g as usize * dq);
            match write {
                DqWrite::Atomic => {
                    for (col, x) in dq_i.iter().enumerate() {
                        c.dq_acc.atomic_add(start + col, *x);
                    }
                }
                DqWrite::Owned { .. } if self.store_first => c.dq_acc.write_from(start, dq_i),
                DqWrite::Owned { .. } | DqWrite::Ordered { .. } => {
                    for (col, x) in dq_i.iter().enumerate() {
                        c.dq_acc.set(start + col, c.dq_acc.get(start + col) + *x);
                    }
                }
            }
        }
        if let Some(counter) = turn {
            counter.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    /// dK (scaled) and dV of the unit's keys.
    fn finish(mut self) {
        let (c, s) = (self.c, &self.c.kargs.shape);
        let (b, hk) = (self.unit.batch, self.unit.head);
        for j in 0..self.k_tile.rows() {
            let row = self.rows.k_start + self.j0 + j as i64;
            scale(s.scale, self.dk_acc.row_mut(j));
            c.dk.write_row(b, hk, row, self.dk_acc.row(j), &mut self.staging);
            c.dv.write_row(b, hk, row, self.dv_acc.row(j), &mut self.staging);
        }
    }
}
