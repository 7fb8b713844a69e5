use crate::common::*;
use tensor_arena_ort::*;

#[test]
fn explore() {
    let rt = runtime();
    for m in ["densenet121_batch.onnx"] {
        let s = ArenaSession::open(rt, model(m), ArenaOptions::default()).unwrap();
        println!("{m}: {:?} -> {:?}", s.inputs(), s.outputs());
        let mut w = s.worker().unwrap();
        for b in [1usize, 4, 1, 4] {
            let x = make_input(&s.inputs()[0], &[b, 3, 224, 224], 7).unwrap();
            let out = w.run(&[("data_0", &x)]).unwrap();
            println!(
                "{:?} {:?} calls {} hash {:x} stats {:?}",
                out.outputs[0].1.dtype(),
                out.report,
                out.alloc_calls,
                out.hash().unwrap(),
                w.stats()
            );
        }
    }
}
