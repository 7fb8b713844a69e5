# The stand-in for torchvision that goes with ../torch (see there).
import torch
class _Model:
    def to(self, d):
        self.w = torch.Tensor(40, True); return self
    def eval(self): return self
    def __call__(self, x):
        a = torch.Tensor(x.batch * 3, True)
        b = torch.Tensor(x.batch * 2, True)
        del a
        c = torch.Tensor(x.batch * 4, True)
        del b, c
        return torch.Tensor(x.batch, True)
class models:
    densenet121 = staticmethod(lambda weights=None: _Model())
    resnet50 = staticmethod(lambda weights=None: _Model())
