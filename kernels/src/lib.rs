//! CUDA kernels for cleave. The CUDA backend arrives with the CUDA issue; this crate holds the
//! kernel sources and their typed launchers once they exist.
