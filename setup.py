from setuptools import find_packages, setup

setup(
    name="basebn",
    version="0.1.0",
    description="MegEngine image-classification trainer that gets BatchNorm right and fast",
    python_requires=">=3.8,<3.11",  # MegEngine 1.13 wheels exist for CPython 3.8-3.10 only
    # basebn.zoo_data is the repository's zoo/ (zoo.json, README, weights): basebn.zoo.zoo_dir() finds it installed
    packages=find_packages(include=["basebn", "basebn.*"]) + ["basebn.zoo_data"],
    package_dir={"basebn.zoo_data": "zoo"},
    include_package_data=True,
    package_data={"basebn": ["kernels/*.cpp", "kernels/*.h", "kernels/*.cu"],  # built on first use
                  "basebn.zoo_data": ["zoo.json", "README.md", "*.npz"]},
    install_requires=[
        "megengine>=1.13,<1.14",
        "basecore",
        "numpy<2",  # MegEngine's extension fails to import under numpy 2
        "opencv-python<4.11",  # 4.11+ needs numpy 2
        "loguru",
        "ninja",  # builds the custom BN ops on first use
    ],
    extras_require={
        "mpi": ["mpi4py", "mpich"],
        "plot": ["matplotlib"],
        "test": ["pytest", "mpi4py", "mpich", "matplotlib"],
    },
)
