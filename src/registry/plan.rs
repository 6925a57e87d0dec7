//! What a call launches: its stages in launch order, each a kernel and, for the one whose tile
//! defines the call (the attention kernel), the registry instance. `fmha_*_plan_json` hands it to
//! users and to `fmha-bench`, so that a timing names the kernels it timed.

use super::{Instance, Operation};
use crate::runtime::Arch;

/// One kernel launch of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The kernel's role, e.g. `fwd`, `dot_do_o`, `combine`.
    pub kernel: &'static str,
    /// The registry instance this stage runs (the tile-independent stages have none).
    pub instance: Option<Instance>,
    /// What decides the stage's extent when it is not the whole problem (e.g. which part of dq_acc
    /// the zeroing covers).
    pub note: Option<&'static str>,
}

impl Stage {
    pub fn kernel(kernel: &'static str) -> Stage {
        Stage { kernel, instance: None, note: None }
    }

    pub fn instance(kernel: &'static str, instance: Instance) -> Stage {
        Stage { kernel, instance: Some(instance), note: None }
    }

    pub fn with_note(self, note: &'static str) -> Stage {
        Stage { note: Some(note), ..self }
    }
}

/// The stages one call of an operation enqueues, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub operation: Operation,
    pub arch: Arch,
    pub stages: Vec<Stage>,
}

impl Plan {
    /// `{"operation":…,"arch":…,"stages":[{"kernel":…,"instance":{…}|null,"note":…|null},…]}`; the
    /// instance objects are the registry's (`fmha_registry_json`).
    pub fn to_json(&self) -> String {
        let stages: Vec<String> = self
            .stages
            .iter()
            .map(|s| {
                format!(
                    "{{\"kernel\":\"{}\",\"instance\":{},\"note\":{}}}",
                    s.kernel,
                    s.instance.as_ref().map_or_else(|| "null".to_string(), Instance::to_json),
                    s.note.map_or_else(|| "null".to_string(), |n| format!("\"{n}\""))
                )
            })
            .collect();
        format!(
            "{{\"operation\":\"{}\",\"arch\":\"{}\",\"stages\":[{}]}}",
            self.operation.name(),
            self.arch.name(),
            stages.join(",")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::instances;

    #[test]
    fn json_names_every_stage_in_order() {
        let instance = instances(Arch::Host)[0];
        let plan = Plan {
            operation: Operation::Backward,
            arch: Arch::Host,
            stages: vec![
                Stage::kernel("dot_do_o"),
                Stage::kernel("zero_dq_acc").with_note("whole dq_acc"),
                Stage::instance("dq_dk_dv", instance),
            ],
        };
        let json = plan.to_json();
        let order: Vec<usize> =
            ["\"dot_do_o\"", "\"zero_dq_acc\"", "\"dq_dk_dv\""].iter().map(|k| json.find(k).unwrap()).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{json}");
        assert!(json.contains(&instance.to_json()));
        assert!(json.contains("\"note\":\"whole dq_acc\"") && json.contains("\"note\":null"));
        assert!(json.starts_with("{\"operation\":\"bwd\",\"arch\":\"host\""));
    }
}
