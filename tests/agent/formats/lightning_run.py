"""A tiny real PyTorch Lightning fit on CPU (progress bar + self.log(..., prog_bar=True)).

Usage: python lightning_run.py OUT_DIR MAX_STEPS [LOG_EVERY_N_STEPS|default] [tqdm|rich] [CKPT_PATH]
Regenerates the lightning_*.txt captures and is what the realpkg test runs.
"""

import sys

import torch
import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, _idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    out, max_steps = sys.argv[1], int(sys.argv[2])
    every = sys.argv[3] if len(sys.argv) > 3 else "default"
    bar = sys.argv[4] if len(sys.argv) > 4 else "tqdm"
    resume = sys.argv[5] if len(sys.argv) > 5 else None
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=4)  # 10 batches an epoch
    kw = {} if every == "default" else {"log_every_n_steps": int(every)}
    # Lightning picks RichProgressBar when rich is importable (textual brings it), tqdm otherwise.
    kw["callbacks"] = [TQDMProgressBar() if bar == "tqdm" else RichProgressBar()]
    trainer = L.Trainer(default_root_dir=out, max_steps=max_steps, accelerator="cpu",
                        devices=1, enable_model_summary=False, **kw)
    trainer.fit(Tiny(), loader, ckpt_path=resume)


if __name__ == "__main__":
    main()
