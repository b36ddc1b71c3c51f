"""train_gpt when a checkpoint cannot be written, through the launcher on 2 CPU ranks.

- A file-size limit (`ulimit -f`: EFBIG, SIGXFSZ ignored as a shell's `ulimit` leaves it to
  the program) on every rank: with the default --on-save-error stop, the run ends with exit
  status 1 and a message naming the step, the file and the cause; no rank aborts; no .tmp
  file is left; `latest` still names the last complete checkpoint. With --on-save-error
  continue, rank 0 warns at each failed save and the run trains to its end.
- A full disk under one rank's ZeRO file only (its .tmp a link to /dev/full: ENOSPC): every
  rank stops, that rank naming the cause, the other saying it failed on another rank.
- A closed output pipe (`dscpp ... | head` after head exited): the run goes on to its end and
  saves its checkpoint.
"""
import argparse
import glob
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "data"))
sys.path.insert(0, os.path.dirname(HERE))  # tests/
import megatron_format  # noqa: E402
from dscpp_test_ports import free_port  # noqa: E402

FAILED = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name)
    if not ok:
        FAILED.append(name)
        print(detail[-3000:])


def file_size_limit(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited through exec: EFBIG, not death
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return apply


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(7 * i + j) % 64 for j in range(40)]] for i in range(16)], "uint16")
        model = os.path.join(tmp, "gpt.json")
        with open(model, "w") as f:
            json.dump({"hidden_size": 16, "num_layers": 1, "num_attention_heads": 2, "seq_length": 8,
                       "vocab_size": 64, "ffn_hidden_size": 32, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                       "layernorm_epsilon": 1e-5, "init_method_std": 0.02, "tie_word_embeddings": True}, f)
        ds = os.path.join(tmp, "ds.json")
        with open(ds, "w") as f:
            json.dump({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1 << 30,
                       "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}}, f)
        ck = os.path.join(tmp, "ck")

        def run(*flags, preexec=None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT):
            cmd = [args.launcher, "--num_gpus", "2", "--master_port", str(free_port()), args.train_gpt,
                   "--model-config", model, "--data-path", prefix, "--deepspeed_config", ds,
                   "--log-interval", "1", *flags]
            p = subprocess.run(cmd, stdout=stdout, stderr=stderr, text=True, timeout=300, preexec_fn=preexec,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            return p.returncode, p.stdout or ""

        def latest():
            with open(os.path.join(ck, "latest")) as f:
                return f.read()

        def leftovers():
            return glob.glob(os.path.join(ck, "**", "*.tmp"), recursive=True)

        rc, log = run("--save", ck, "--save-interval", "2", "--train-iters", "2")
        check("a first checkpoint is saved", rc == 0 and latest() == "global_step2", log)

        # EFBIG on every rank: 4 KiB is less than any checkpoint file here.
        limit = file_size_limit(4096)
        rc, log = run("--load", ck, "--save", ck, "--save-interval", "2", "--train-iters", "4", preexec=limit)
        check("EFBIG, --on-save-error stop: exit status 1", rc == 1, log)
        check("EFBIG: the message names the step, the file and the cause",
              "stopping: the checkpoint of step 4 was not saved" in log and "zero_pp_rank_" in log
              and ".pt.tmp': File too large" in log, log)
        check("EFBIG: no rank aborts", "terminate called" not in log and "c10::Error" not in log
              and "Aborted" not in log, log)
        check("EFBIG: no .tmp file is left", leftovers() == [], str(leftovers()))
        check("EFBIG: latest still names global_step2", latest() == "global_step2", latest())

        rc, log = run("--load", ck, "--save", ck, "--save-interval", "2", "--train-iters", "6",
                      "--on-save-error", "continue", preexec=limit)
        check("EFBIG, --on-save-error continue: trains to its end, exit status 0",
              rc == 0 and "[train_gpt] step 6/6" in log, log)
        warnings = [l for l in log.splitlines() if "warning: the checkpoint of step" in l]
        check("continue: rank 0 warns once per failed save (steps 4 and 6)",
              len(warnings) == 2 and "step 4 was not saved" in warnings[0] and "step 6 was not saved" in warnings[1]
              and all("File too large" in w for w in warnings), log)
        check("continue: no .tmp file is left, latest unchanged", leftovers() == [] and latest() == "global_step2",
              str(leftovers()))

        rc, log = run("--on-save-error", "sometimes", "--train-iters", "1")
        check("--on-save-error sometimes is refused",
              rc == 2 and "--on-save-error: expected stop or continue, found 'sometimes'" in log, log)

        # ENOSPC under rank 1's ZeRO file alone.
        if os.path.exists("/dev/full"):
            os.makedirs(os.path.join(ck, "global_step4"), exist_ok=True)
            link = os.path.join(ck, "global_step4", "zero_pp_rank_1_mp_rank_00_optim_states.pt.tmp")
            os.symlink("/dev/full", link)
            rc, log = run("--load", ck, "--save", ck, "--save-interval", "2", "--train-iters", "4")
            check("ENOSPC on rank 1: exit status 1", rc == 1, log)
            check("ENOSPC: rank 1 names its file and the cause",
                  "zero_pp_rank_1_mp_rank_00_optim_states.pt.tmp': No space left on device" in log, log)
            check("ENOSPC: rank 0 says the save failed on another rank", "failed on another rank" in log, log)
            check("ENOSPC: the link is removed, no .tmp left", not os.path.lexists(link) and leftovers() == [],
                  str(leftovers()))
            check("ENOSPC: latest still names global_step2", latest() == "global_step2", latest())
        else:
            print("SKIP ENOSPC: no /dev/full on this system")

        # Output into a pipe whose reader has gone: the launcher and the ranks write into it
        # (EPIPE), and the run still trains to its end and saves.
        r, w = os.pipe()
        os.close(r)
        ck2 = os.path.join(tmp, "ck2")
        rc, _ = run("--save", ck2, "--train-iters", "2", stdout=w, stderr=w)
        os.close(w)
        saved = os.path.exists(os.path.join(ck2, "latest")) and open(os.path.join(ck2, "latest")).read()
        check("a closed output pipe: the run ends with exit status 0 and saves", rc == 0 and saved == "global_step2",
              f"rc={rc} latest={saved}")
    if FAILED:
        print(f"{len(FAILED)} check(s) failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
