"""A tiny real Hugging Face Trainer run on CPU: GPT-2 from a config (no download).

Usage: python hf_trainer_run.py OUT_DIR MAX_STEPS [LOGGING_STEPS|default] [SAVE_STEPS] [resume]
SAVE_STEPS turns on checkpoints and log_level="info" (which prints "Saving model checkpoint to");
"resume" resumes from the last checkpoint in OUT_DIR.
Regenerates the hf_*.txt captures (see README in this folder) and is what the realpkg test runs.
"""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seq=16, vocab=64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    out, max_steps = sys.argv[1], int(sys.argv[2])
    logging = sys.argv[3] if len(sys.argv) > 3 else "default"
    save = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    kw = {}
    if logging != "default":
        kw["logging_steps"] = int(logging)
    if save:
        kw.update(save_strategy="steps", save_steps=save, save_total_limit=1, log_level="info")
    else:
        kw["save_strategy"] = "no"
    args = TrainingArguments(output_dir=out, max_steps=max_steps, per_device_train_batch_size=2,
                             report_to=[], use_cpu=True, dataloader_num_workers=0, **kw)
    resume = len(sys.argv) > 5 and sys.argv[5] == "resume"
    Trainer(model=model, args=args, train_dataset=Tokens(2048)).train(resume_from_checkpoint=resume or None)


if __name__ == "__main__":
    main()
