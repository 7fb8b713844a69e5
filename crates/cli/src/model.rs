//! The built-in workload: a BERT-style transformer encoder, described as a
//! small graph of operators with tensor shapes, and turned into allocation
//! events the way a runtime executing it would (the same rules as the trace
//! files, `traces/README.md`).
//!
//! The graph is written as the operators a runtime runs after the usual
//! fusions (bias into MatMul, LayerNorm and GELU as one kernel each, the
//! attention scale into the score MatMul); a reshape is a view, a transpose
//! makes a copy. Weights and graph inputs are not allocated. Everything is
//! f32.

use crate::workload::{Ev, RunSpec, Workload};

/// Bytes per element (f32).
const F32: usize = 4;

/// Shapes of one encoder architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// Name on the command line (`--model`).
    pub name: &'static str,
    /// Encoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads (`hidden` is a multiple of it).
    pub heads: usize,
    /// Width of the feed-forward block.
    pub ffn: usize,
}

/// The built-in models: BERT-base and large, and Google's compact BERTs
/// (Turc et al. 2019) for quick runs.
pub const MODELS: [ModelSpec; 5] = [
    ModelSpec {
        name: "bert-tiny",
        layers: 2,
        hidden: 128,
        heads: 2,
        ffn: 512,
    },
    ModelSpec {
        name: "bert-mini",
        layers: 4,
        hidden: 256,
        heads: 4,
        ffn: 1024,
    },
    ModelSpec {
        name: "bert-small",
        layers: 4,
        hidden: 512,
        heads: 8,
        ffn: 2048,
    },
    ModelSpec {
        name: "bert-base",
        layers: 12,
        hidden: 768,
        heads: 12,
        ffn: 3072,
    },
    ModelSpec {
        name: "bert-large",
        layers: 24,
        hidden: 1024,
        heads: 16,
        ffn: 4096,
    },
];

impl ModelSpec {
    /// The model called `name`, if built in.
    pub fn find(name: &str) -> Option<ModelSpec> {
        MODELS.iter().copied().find(|m| m.name == name)
    }

    /// One line: name and shapes.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} layers, hidden {}, {} heads, FFN {})",
            self.name, self.layers, self.hidden, self.heads, self.ffn
        )
    }
}

/// The workload of running `model` once per sequence length, in order, at
/// batch size `batch`.
pub fn workload(model: ModelSpec, batch: usize, seq_lens: &[usize]) -> Workload {
    let lens: Vec<String> = seq_lens.iter().map(usize::to_string).collect();
    Workload {
        description: format!(
            "built-in {}, f32, batch {batch}, sequence lengths {}",
            model.describe(),
            lens.join(",")
        ),
        runs: seq_lens
            .iter()
            .map(|&seq| RunSpec {
                label: format!("{batch}x{seq}"),
                events: encoder_graph(model, batch, seq).events(),
            })
            .collect(),
    }
}

/// Index of a tensor in a [`Graph`].
type TensorId = usize;

/// A tensor: graph inputs are not allocated, everything else is.
#[derive(Debug)]
struct Tensor {
    dims: Vec<usize>,
    /// A graph input (or derived from weights only): the runtime does not
    /// allocate it.
    external: bool,
}

/// One operator: reads `inputs`, writes `outputs`.
#[derive(Debug)]
struct Node {
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
}

/// Operators in execution (topological) order.
#[derive(Debug, Default)]
struct Graph {
    tensors: Vec<Tensor>,
    nodes: Vec<Node>,
    /// Graph outputs: live until the end of the run.
    outputs: Vec<TensorId>,
}

impl Graph {
    /// A graph input of shape `dims` (not allocated by the runtime).
    fn input(&mut self, dims: &[usize]) -> TensorId {
        self.tensors.push(Tensor {
            dims: dims.to_vec(),
            external: true,
        });
        self.tensors.len() - 1
    }

    /// Appends an operator reading `inputs` and writing one new f32 tensor of
    /// shape `dims`; returns that tensor.
    fn op(&mut self, inputs: &[TensorId], dims: &[usize]) -> TensorId {
        self.tensors.push(Tensor {
            dims: dims.to_vec(),
            external: false,
        });
        let out = self.tensors.len() - 1;
        self.nodes.push(Node {
            inputs: inputs.to_vec(),
            outputs: vec![out],
        });
        out
    }

    /// The allocation events of one execution: nodes in order; for each,
    /// an alloc per output, then a free per input whose last consumer it is,
    /// then a free per output nothing consumes; graph outputs are freed at
    /// the end. Lifetimes come from the graph alone.
    fn events(&self) -> Vec<Ev> {
        let n = self.tensors.len();
        let mut last_use: Vec<Option<usize>> = vec![None; n];
        for (i, node) in self.nodes.iter().enumerate() {
            for &t in &node.inputs {
                last_use[t] = Some(i);
            }
        }
        let mut is_output = vec![false; n];
        for &t in &self.outputs {
            is_output[t] = true;
        }
        let mut dense: Vec<Option<u32>> = vec![None; n];
        let mut next = 0u32;
        let mut events = Vec::new();
        let free = |t: TensorId, dense: &mut [Option<u32>], events: &mut Vec<Ev>| {
            if let Some(id) = dense[t].take() {
                events.push(Ev::Free { id });
            }
        };
        for (i, node) in self.nodes.iter().enumerate() {
            for &t in &node.outputs {
                let bytes = self.tensors[t].dims.iter().product::<usize>() * F32;
                dense[t] = Some(next);
                events.push(Ev::Alloc { id: next, bytes });
                next += 1;
            }
            for &t in &node.inputs {
                if !self.tensors[t].external && !is_output[t] && last_use[t] == Some(i) {
                    free(t, &mut dense, &mut events);
                }
            }
            for &t in &node.outputs {
                if last_use[t].is_none() && !is_output[t] {
                    free(t, &mut dense, &mut events);
                }
            }
        }
        for &t in &self.outputs {
            free(t, &mut dense, &mut events);
        }
        events
    }
}

/// The encoder of `m` at batch `b` and sequence length `s`: embeddings,
/// `m.layers` post-LayerNorm transformer layers, and the pooler.
fn encoder_graph(m: ModelSpec, b: usize, s: usize) -> Graph {
    let (h, nh, f) = (m.hidden, m.heads, m.ffn);
    let d = h / nh;
    let mut g = Graph::default();
    let ids = g.input(&[b, s]);
    let mask = g.input(&[b, s]);
    // Embeddings: word lookup, plus position (and token type) rows, LayerNorm.
    let bias = g.op(&[mask], &[b, 1, 1, s]); // (1 - mask) * -10000, as f32
    let word = g.op(&[ids], &[b, s, h]); // Gather
    let summed = g.op(&[word], &[b, s, h]); // Add position embeddings
    let mut x = g.op(&[summed], &[b, s, h]); // LayerNorm
    for _ in 0..m.layers {
        // Self-attention.
        let q = g.op(&[x], &[b, s, h]); // MatMul + bias
        let k = g.op(&[x], &[b, s, h]);
        let v = g.op(&[x], &[b, s, h]);
        let qh = g.op(&[q], &[b, nh, s, d]); // Reshape (view) + Transpose
        let kh = g.op(&[k], &[b, nh, d, s]); // K transposed for QK^T
        let vh = g.op(&[v], &[b, nh, s, d]);
        let scores = g.op(&[qh, kh], &[b, nh, s, s]); // QK^T / sqrt(d)
        let masked = g.op(&[scores, bias], &[b, nh, s, s]); // + mask bias
        let probs = g.op(&[masked], &[b, nh, s, s]); // Softmax
        let ctx = g.op(&[probs, vh], &[b, nh, s, d]); // PV
        let merged = g.op(&[ctx], &[b, s, h]); // Transpose + Reshape back
        let attn = g.op(&[merged], &[b, s, h]); // output projection
        let res1 = g.op(&[attn, x], &[b, s, h]); // residual
        let ln1 = g.op(&[res1], &[b, s, h]); // LayerNorm
                                             // Feed-forward.
        let up = g.op(&[ln1], &[b, s, f]); // MatMul + bias
        let act = g.op(&[up], &[b, s, f]); // GELU
        let down = g.op(&[act], &[b, s, h]); // MatMul + bias
        let res2 = g.op(&[down, ln1], &[b, s, h]); // residual
        x = g.op(&[res2], &[b, s, h]); // LayerNorm
    }
    // Pooler: first token, dense, tanh.
    let cls = g.op(&[x], &[b, h]);
    let dense = g.op(&[cls], &[b, h]);
    let pooled = g.op(&[dense], &[b, h]);
    g.outputs = vec![x, pooled];
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_follow_the_graph() {
        // a -> b -> c (output), a -> c: a dies at the node making c.
        let mut g = Graph::default();
        let i = g.input(&[1]);
        let a = g.op(&[i], &[1]);
        let b = g.op(&[a], &[2]);
        let c = g.op(&[a, b], &[3]);
        let _unused = g.op(&[b], &[4]);
        g.outputs = vec![c];
        assert_eq!(
            g.events(),
            vec![
                Ev::Alloc { id: 0, bytes: 4 },
                Ev::Alloc { id: 1, bytes: 8 },
                Ev::Alloc { id: 2, bytes: 12 },
                Ev::Free { id: 0 },
                Ev::Alloc { id: 3, bytes: 16 },
                Ev::Free { id: 1 },
                Ev::Free { id: 3 },
                Ev::Free { id: 2 },
            ]
        );
    }

    #[test]
    fn bert_base_shapes() {
        let m = ModelSpec::find("bert-base").unwrap();
        let w = workload(m, 1, &[128]);
        let run = &w.runs[0];
        assert_eq!(run.allocs(), 4 + 12 * 19 + 3);
        // Every alloc is freed once.
        let frees = run
            .events
            .iter()
            .filter(|e| matches!(e, Ev::Free { .. }))
            .count();
        assert_eq!(frees, run.allocs());
        // At 128 tokens the peak is in the feed-forward block, at GELU: its
        // input and output (4 x hidden each) and the LayerNorm output kept
        // for the residual, plus the mask bias that lives all run.
        let act = 128 * 768 * 4;
        assert_eq!(run.lower_bound(), 9 * act + 128 * 4);
        // At 512 it is in attention: scores and masked scores (12x512x512),
        // the layer input kept for the residual, V's heads and the mask bias.
        let run = &workload(m, 1, &[512]).runs[0];
        let (attn, act) = (12 * 512 * 512 * 4, 512 * 768 * 4);
        assert_eq!(run.lower_bound(), 2 * attn + 2 * act + 512 * 4);
    }
}
