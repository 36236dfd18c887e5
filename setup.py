from setuptools import find_packages, setup

# ONNX export and onnxruntime evaluation (python -m basebn.deploy); versions that run with numpy<2 on 3.10
DEPLOY = ["onnx>=1.16,<1.18", "onnxruntime>=1.18,<1.21"]

setup(
    name="basebn",
    version="0.1.0",
    description="MegEngine image-classification trainer that gets BatchNorm right and fast",
    python_requires=">=3.8,<3.11",  # MegEngine 1.13 wheels exist for CPython 3.8-3.10 only
    # basebn.zoo_data is the repository's zoo/ (zoo.json, README, weights): basebn.zoo.zoo_dir() finds it installed;
    # basebn.zoo_data.configs is the repository's configs/ (the zoo entries' configs, hash-checked before they run):
    # installed, an entry's "configs/NAME.py" resolves inside basebn/zoo_data as it does in the source tree root
    packages=find_packages(include=["basebn", "basebn.*"]) + ["basebn.zoo_data", "basebn.zoo_data.configs"],
    package_dir={"basebn.zoo_data": "zoo", "basebn.zoo_data.configs": "configs"},
    include_package_data=True,
    package_data={"basebn.ops": ["csrc/*.cpp", "csrc/*.h", "csrc/*.cu", "csrc/*.cuh"],  # built on first use
                  "basebn.zoo_data": ["zoo.json", "README.md", "*.npz"]},
    install_requires=[
        "megengine>=1.13,<1.14",
        "basecore",
        "numpy<2",  # MegEngine's extension fails to import under numpy 2
        "opencv-python<4.11",  # 4.11+ needs numpy 2
        "loguru",
        "ninja",  # builds the custom BN and conv ops on first use
        # oneDNN 3.2 (GNU OpenMP build) for the CPU convolution ops; the 2026 wheels need a SYCL runtime
        "onednn-cpu-gomp==2023.2.0",
        "onednn-devel-cpu-gomp==2023.2.0",
        "pillow",  # image decoding (WebP, CMYK) and the AutoAugment/RandAugment ops, as timm
        "safetensors",  # timm:/Hugging Face weights, read with its numpy API (no torch)
        "tensorboardX",  # TensorBoard event files (log.tensorboard): pulls in protobuf and packaging only
    ],
    extras_require={
        "mpi": ["mpi4py", "mpich"],
        "plot": ["matplotlib"],
        "deploy": DEPLOY,
        # tensorboard: its event reader; pytest-xdist: make test's parallel workers
        "test": ["pytest", "pytest-xdist", "mpi4py", "mpich", "matplotlib", "tensorboard"] + DEPLOY,
    },
)
