"""Runs pytorch-metric-learning's own tests with this package's drop-ins swapped in.

PML's test folder is third-party code kept outside the project, at
``../shared/anchors/pml-tests/tests`` (PML at a pinned commit); it is copied to a temporary
folder beside ``conftest.py`` (which swaps the classes in) and run there on the CPU in
float32, as PML's baseline was measured. Exit status: pytest's.

Usage: ``python python/pml_suite/run.py [--backend cpu|gpu] [PML_TESTS_DIR] [-- pytest args]``
(``cpu``, the default: the native path; ``gpu``: the wgpu path, failing without an adapter)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parents[2] / "shared" / "anchors" / "pml-tests" / "tests"

# PML's tests for what the package replaces: every miner, CrossBatchMemory, the losses it
# computes (SupConLoss is tested in PML's NTXent file, GeneralizedLiftedStructureLoss in its
# lifted structure file) and the accuracy calculator (its default kNN).
FILES = [
    "miners",
    "losses/test_cross_batch_memory.py",
    "losses/test_triplet_margin_loss.py",
    "losses/test_ntxent_loss.py",
    "losses/test_contrastive_loss.py",
    "losses/test_multi_similarity_loss.py",
    "losses/test_circle_loss.py",
    "losses/test_nca_loss.py",
    "losses/test_lifted_structure_loss.py",
    "losses/test_margin_loss.py",
    "losses/test_fastap_loss.py",
    "losses/test_histogram_loss.py",
    "losses/test_npairs_loss.py",
    "losses/test_instance_loss.py",
    "losses/test_angular_loss.py",
    "losses/test_vicreg_loss.py",
    "losses/test_signal_to_noise_ratio_losses.py",
    "losses/test_dynamic_soft_margin_loss.py",
    "losses/test_pnp_loss.py",
    "losses/test_intra_pair_variance_loss.py",
    "losses/test_ranked_list_loss.py",
    "losses/test_tcm_loss.py",
    "losses/test_tuplet_margin_loss.py",
    "losses/test_arcface_loss.py",
    "losses/test_cosface_loss.py",
    "losses/test_large_margin_softmax_loss.py",
    "losses/test_normalized_softmax_loss.py",
    "losses/test_proxy_nca_loss.py",
    "losses/test_proxy_anchor_loss.py",
    "losses/test_soft_triple_loss.py",
    "losses/test_subcenter_arcface_loss.py",
    "utils/test_calculate_accuracies.py",
    "utils/test_calculate_accuracies_large_k.py",
]


def main(argv):
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    backend = "cpu"
    if argv[:1] == ["--backend"]:
        backend, argv = argv[1], argv[2:]
    source = Path(argv[0]) if argv else DEFAULT
    if not (source / "__init__.py").is_file():
        print(f"PML's test folder is not at {source}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="wml-pml-suite-") as tmp:
        root = Path(tmp)
        shutil.copytree(source, root / "tests")
        shutil.copy(HERE / "conftest.py", root / "conftest.py")
        env = dict(
            os.environ, TEST_DEVICE="cpu", TEST_DTYPES="float32", WML_PML_SUITE_BACKEND=backend
        )
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rxXs"]
        # PML's testing utilities trip a NumPy 2 deprecation thousands of times.
        cmd += ["-W", "ignore::DeprecationWarning"]
        cmd += [f"tests/{f}" for f in FILES] + extra
        return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
