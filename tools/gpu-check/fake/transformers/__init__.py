# The stand-in for transformers that goes with ../torch (see there): a
# "BERT" whose activations scale with the sequence length.
import torch
class BertConfig: pass
class _Out:
    def __init__(self, t): self.last_hidden_state = t
class BertModel:
    def __init__(self, config): pass
    def to(self, d):
        self.w = torch.Tensor(60, True); return self
    def eval(self): return self
    def __call__(self, input_ids):
        x = input_ids
        a = torch.Tensor(x.batch * 2, True)
        b = torch.Tensor(x.batch, True)
        del a, b
        return _Out(torch.Tensor(x.batch, True))
