//! Control plane actors (router, pools, KV transfer).
