//! The kernel variants' settings: [`Variants::from_env`] reads each `CLEAVE_*` variable named on
//! [`Variants`] and says which one is malformed.

use super::*;

/// A two-way setting `name`: `yes` (the default, also when empty) gives true, `no` false.
fn switch(name: &str, v: &str, [yes, no]: [&str; 2]) -> Result<bool> {
    match v {
        "" => Ok(true),
        v if v == yes => Ok(true),
        v if v == no => Ok(false),
        v => Err(EngineError::Config(format!("{name}: `{v}` is not one of {yes}, {no}"))),
    }
}
/// [`switch`]'s words for a fusion and for an on/off setting.
const FUSED: [&str; 2] = ["fused", "separate"];
const ON: [&str; 2] = ["on", "off"];

/// A count setting `name`: empty (`default`), `off` (0), or a number from 1 to `max`.
fn parse_count(name: &str, v: &str, default: usize, max: usize) -> Result<usize> {
    match v {
        "" => Ok(default),
        "off" => Ok(0),
        v => match v.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(EngineError::Config(format!("{name}: `{v}` is not off or a number from 1 to {max}"))),
        },
    }
}

impl Variants {
    pub fn from_env() -> Result<Self> {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let mut v = Self::parse(
            &var("CLEAVE_MLA_DECODE"),
            &var("CLEAVE_MOE_GEMM"),
            &var("CLEAVE_PREFILL_ATTN"),
            &var("CLEAVE_FP8_GEMM"),
            &var("CLEAVE_QGEMM"),
        )?;
        v.moe_rows32 = Self::parse_rows32(&var("CLEAVE_MOE_ROWS32"))?;
        v.prefill_gemm = Self::parse_prefill_gemm(&var("CLEAVE_PREFILL_GEMM"))?;
        v.prefill_fp8 = Self::parse_prefill_fp8(&var("CLEAVE_PREFILL_FP8"))?;
        v.awq_prefill_rows =
            parse_count("CLEAVE_AWQ_PREFILL", &var("CLEAVE_AWQ_PREFILL"), AWQ_EXPAND_MIN_AVG, AWQ_EXPAND_MAX_AVG)?;
        v.fold_shared = match var("CLEAVE_SHARED_EXPERTS").as_str() {
            "" | "folded" => true,
            "separate" => false,
            v => {
                return Err(EngineError::Config(format!("CLEAVE_SHARED_EXPERTS: `{v}` is not one of folded, separate")))
            }
        };
        v.gemv_rows = parse_count("CLEAVE_DENSE_GEMV", &var("CLEAVE_DENSE_GEMV"), DEFAULT_GEMV_ROWS, GEMV_MAX_ROWS)?;
        v.router_gemv_rows = parse_count(
            "CLEAVE_ROUTER_GEMV",
            &var("CLEAVE_ROUTER_GEMV"),
            DEFAULT_ROUTER_GEMV_ROWS,
            ROUTER_GEMV_MAX_ROWS,
        )?;
        v.fusion = Fusion {
            route_align: parse_count(
                "CLEAVE_ROUTE_ALIGN",
                &var("CLEAVE_ROUTE_ALIGN"),
                Fusion::DEFAULT.route_align,
                ROUTE_ALIGN_MAX_TOKENS,
            )?,
            moe_end: switch("CLEAVE_MOE_END", &var("CLEAVE_MOE_END"), FUSED)?,
            mla_join: switch("CLEAVE_MLA_COMBINE", &var("CLEAVE_MLA_COMBINE"), FUSED)?,
        };
        v.qgemm_rows8 = Self::parse_rows8(&var("CLEAVE_QGEMM_ROWS8"))?;
        v.qgemm_streamk = switch("CLEAVE_QGEMM_STREAMK", &var("CLEAVE_QGEMM_STREAMK"), ON)?;
        v.qgemm_halves = Self::parse_halves(&var("CLEAVE_QGEMM_HALVES"))?;
        v.fused_prologue = switch("CLEAVE_MLA_PROLOGUE", &var("CLEAVE_MLA_PROLOGUE"), FUSED)?;
        v.pdl = match var("CLEAVE_PDL").as_str() {
            "" => DEFAULT_PDL,
            "off" => Pdl::Off,
            "light" => Pdl::Light,
            "all" => Pdl::All,
            v => return Err(EngineError::Config(format!("CLEAVE_PDL: `{v}` is not one of off, light, all"))),
        };
        Ok(v)
    }

    /// `CLEAVE_QGEMM_ROWS8`: empty (the default, [`ROWS8_MAX_AVG`]), `off`, or the most rows per
    /// expert on average for 8-row tiles.
    pub fn parse_rows8(v: &str) -> Result<usize> {
        match v {
            "" => Ok(ROWS8_MAX_AVG),
            "off" => Ok(0),
            v => v
                .parse()
                .map_err(|_| EngineError::Config(format!("CLEAVE_QGEMM_ROWS8: `{v}` is not off or a number of rows"))),
        }
    }

    /// `CLEAVE_QGEMM_HALVES`: empty (the default, [`HALVES_MIN_BYTES`]), `off`, or the least
    /// MiB of an expert layer's compressed stacks for half tiles.
    pub fn parse_halves(v: &str) -> Result<Option<usize>> {
        match v {
            "" => Ok(Some(HALVES_MIN_BYTES)),
            "off" => Ok(None),
            v => v.parse::<usize>().ok().and_then(|m| m.checked_mul(1 << 20)).map(Some).ok_or_else(|| {
                EngineError::Config(format!("CLEAVE_QGEMM_HALVES: `{v}` is not off or a number of MiB"))
            }),
        }
    }

    /// `CLEAVE_PREFILL_GEMM`: empty or `wgmma` (the default, [`DEFAULT_WGMMA`]), `mma`, or
    /// `wgmma:BMxBN/STAGES`.
    pub fn parse_prefill_gemm(v: &str) -> Result<Option<WgmmaGemm>> {
        match v {
            "" | "wgmma" => Ok(Some(DEFAULT_WGMMA)),
            "mma" => Ok(None),
            v => match v.strip_prefix("wgmma:") {
                Some(cfg) => {
                    cfg.parse().map(Some).map_err(|e| EngineError::Config(format!("CLEAVE_PREFILL_GEMM: {e}")))
                }
                None => Err(EngineError::Config(format!(
                    "CLEAVE_PREFILL_GEMM: `{v}` is not one of wgmma, mma, wgmma:BMxBN/STAGES"
                ))),
            },
        }
    }

    /// `CLEAVE_PREFILL_FP8`: empty or `wgmma` (the default, [`DEFAULT_FP8_WGMMA_STAGES`]), `mma`,
    /// or `wgmma:STAGES` (a compiled count).
    pub fn parse_prefill_fp8(v: &str) -> Result<Option<usize>> {
        let stages = match v {
            "" | "wgmma" => return Ok(Some(DEFAULT_FP8_WGMMA_STAGES)),
            "mma" => return Ok(None),
            v => v.strip_prefix("wgmma:").and_then(|n| n.parse::<usize>().ok()),
        };
        match stages {
            Some(n) if Gpu::fp8_wgmma_stages_compiled(n) => Ok(Some(n)),
            _ => Err(EngineError::Config(format!(
                "CLEAVE_PREFILL_FP8: `{v}` is not one of wgmma, mma, wgmma:STAGES with a compiled stage count"
            ))),
        }
    }

    /// `CLEAVE_MOE_ROWS32`: empty (the default), `off`, or a 32-row configuration.
    pub fn parse_rows32(v: &str) -> Result<Option<PersistentGemm>> {
        let cfg = match v {
            "" => return Ok(Some(DEFAULT_ROWS32)),
            "off" => return Ok(None),
            v => v.parse::<PersistentGemm>().map_err(|e| EngineError::Config(format!("CLEAVE_MOE_ROWS32: {e}")))?,
        };
        if cfg.bm != 32 {
            return Err(EngineError::Config(format!(
                "CLEAVE_MOE_ROWS32: `{v}` is not a 32-row (32x...) configuration"
            )));
        }
        Ok(Some(cfg))
    }

    /// The variants the five settings name (empty: the default); an unknown value is a
    /// configuration error naming its variable.
    pub fn parse(mla_decode: &str, moe_gemm: &str, prefill_attn: &str, fp8_gemm: &str, qgemm: &str) -> Result<Self> {
        let bad = |var: &str, v: &str, want: &str| EngineError::Config(format!("{var}: `{v}` is not one of {want}"));
        let mla = match mla_decode {
            "" => MlaDecode::Auto,
            v => v.parse().map_err(|e| EngineError::Config(format!("CLEAVE_MLA_DECODE: {e}")))?,
        };
        let (gemm_v2, moe_persistent) = match moe_gemm {
            "" | "persistent" => (true, Some(DEFAULT_PERSISTENT)),
            "v2" => (true, None),
            "v1" => (false, None),
            v => match v.strip_prefix("persistent:") {
                Some(cfg) => {
                    let cfg = cfg.parse().map_err(|e| EngineError::Config(format!("CLEAVE_MOE_GEMM: {e}")))?;
                    (true, Some(cfg))
                }
                None => return Err(bad("CLEAVE_MOE_GEMM", v, "v1, v2, persistent, persistent:BN/BK/STAGES/PREFETCH")),
            },
        };
        let expanded_prefill = match prefill_attn {
            "" | "expanded" => true,
            "absorbed" => false,
            v => return Err(bad("CLEAVE_PREFILL_ATTN", v, "absorbed, expanded")),
        };
        let fp8_tensor_cores = match fp8_gemm {
            "" | "tensor-cores" => true,
            "bf16" => false,
            v => return Err(bad("CLEAVE_FP8_GEMM", v, "tensor-cores, bf16")),
        };
        let qgemm = match qgemm {
            "" | "persistent" => QuantGemm::Persistent(None),
            "tiled" => QuantGemm::Tiled,
            v => match v.strip_prefix("persistent:") {
                Some(cfg) => QuantGemm::Persistent(Some(
                    cfg.parse().map_err(|e| EngineError::Config(format!("CLEAVE_QGEMM: {e}")))?,
                )),
                None => return Err(bad("CLEAVE_QGEMM", v, "persistent, persistent:[BMx]BN/BK/STAGES, tiled")),
            },
        };
        let moe_rows32 = moe_persistent.map(|_| DEFAULT_ROWS32);
        Ok(Variants {
            mla,
            gemm_v2,
            prefill_gemm: Some(DEFAULT_WGMMA),
            prefill_fp8: Some(DEFAULT_FP8_WGMMA_STAGES),
            awq_prefill_rows: AWQ_EXPAND_MIN_AVG,
            moe_persistent,
            moe_rows32,
            expanded_prefill,
            fp8_tensor_cores,
            qgemm,
            qgemm_streamk: true,
            qgemm_rows8: ROWS8_MAX_AVG,
            qgemm_halves: Some(HALVES_MIN_BYTES),
            fold_shared: true,
            gemv_rows: DEFAULT_GEMV_ROWS,
            router_gemv_rows: DEFAULT_ROUTER_GEMV_ROWS,
            fused_prologue: true,
            pdl: DEFAULT_PDL,
            fusion: Fusion::DEFAULT,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_ones_name_their_variable() {
        let def = Variants::parse("", "", "", "", "").unwrap();
        assert_eq!(
            def,
            Variants {
                mla: MlaDecode::Auto,
                gemm_v2: true,
                prefill_gemm: Some(DEFAULT_WGMMA),
                prefill_fp8: Some(DEFAULT_FP8_WGMMA_STAGES),
                awq_prefill_rows: AWQ_EXPAND_MIN_AVG,
                moe_persistent: Some(DEFAULT_PERSISTENT),
                moe_rows32: Some(DEFAULT_ROWS32),
                expanded_prefill: true,
                fp8_tensor_cores: true,
                qgemm: QuantGemm::Persistent(None),
                qgemm_streamk: true,
                qgemm_rows8: ROWS8_MAX_AVG,
                qgemm_halves: Some(HALVES_MIN_BYTES),
                fold_shared: true,
                gemv_rows: DEFAULT_GEMV_ROWS,
                router_gemv_rows: DEFAULT_ROUTER_GEMV_ROWS,
                fused_prologue: true,
                pdl: DEFAULT_PDL,
                fusion: Fusion::DEFAULT,
            }
        );
        let first = Variants::parse("v1", "v1", "absorbed", "bf16", "tiled").unwrap();
        let later = Variants {
            prefill_gemm: Some(DEFAULT_WGMMA),
            prefill_fp8: Some(DEFAULT_FP8_WGMMA_STAGES),
            awq_prefill_rows: AWQ_EXPAND_MIN_AVG,
            qgemm_streamk: true,
            qgemm_rows8: ROWS8_MAX_AVG,
            qgemm_halves: Some(HALVES_MIN_BYTES),
            fold_shared: true,
            gemv_rows: DEFAULT_GEMV_ROWS,
            router_gemv_rows: DEFAULT_ROUTER_GEMV_ROWS,
            fused_prologue: true,
            pdl: DEFAULT_PDL,
            fusion: Fusion::DEFAULT,
            ..Variants::FIRST
        };
        assert_eq!(first, later);
        let gemv = |v| parse_count("CLEAVE_DENSE_GEMV", v, DEFAULT_GEMV_ROWS, GEMV_MAX_ROWS);
        assert_eq!(gemv("off").unwrap(), 0);
        assert_eq!(gemv("").unwrap(), DEFAULT_GEMV_ROWS);
        assert_eq!(Variants::parse_rows8("").unwrap(), ROWS8_MAX_AVG);
        assert_eq!(Variants::parse_rows8("off").unwrap(), 0);
        assert_eq!(Variants::parse_rows8("16").unwrap(), 16);
        assert!(Variants::parse_rows8("-1").unwrap_err().to_string().contains("CLEAVE_QGEMM_ROWS8"));
        assert_eq!(gemv("4").unwrap(), 4);
        let router = |v| parse_count("CLEAVE_ROUTER_GEMV", v, DEFAULT_ROUTER_GEMV_ROWS, ROUTER_GEMV_MAX_ROWS);
        assert_eq!(router("").unwrap(), DEFAULT_ROUTER_GEMV_ROWS);
        assert_eq!(router("64").unwrap(), 64);
        assert!(router("1025").unwrap_err().to_string().contains("CLEAVE_ROUTER_GEMV"));
        assert_eq!(Variants::parse_halves("").unwrap(), Some(HALVES_MIN_BYTES));
        assert_eq!(Variants::parse_halves("off").unwrap(), None);
        assert_eq!(Variants::parse_halves("0").unwrap(), Some(0));
        assert_eq!(Variants::parse_halves("2").unwrap(), Some(2 << 20));
        assert!(Variants::parse_halves("on").unwrap_err().to_string().contains("CLEAVE_QGEMM_HALVES"));
        assert!(!switch("CLEAVE_QGEMM_STREAMK", "off", ON).unwrap());
        assert!(switch("CLEAVE_QGEMM_STREAMK", "", ON).unwrap());
        assert!(switch("CLEAVE_QGEMM_STREAMK", "1", ON).unwrap_err().to_string().contains("CLEAVE_QGEMM_STREAMK"));
        assert!(switch("CLEAVE_MOE_END", "", FUSED).unwrap());
        assert!(!switch("CLEAVE_MOE_END", "separate", FUSED).unwrap());
        assert!(switch("CLEAVE_MOE_END", "on", FUSED).unwrap_err().to_string().contains("CLEAVE_MOE_END"));
        for bad in ["0", "9", "fast"] {
            assert!(gemv(bad).unwrap_err().to_string().contains("CLEAVE_DENSE_GEMV"));
        }
        assert_eq!(Variants::parse("", "v2", "", "", "").unwrap().moe_persistent, None);
        assert_eq!(Variants::parse("v3:32", "", "", "", "").unwrap().mla, MlaDecode::V3(Some(32)));
        let custom = Variants::parse("", "persistent:16/64/4/2", "", "", "").unwrap();
        assert_eq!(custom.moe_persistent, Some(PersistentGemm { bm: 16, bn: 16, bk: 64, stages: 4, prefetch: 2 }));
        assert_eq!(Variants::parse_prefill_gemm("mma").unwrap(), None);
        assert_eq!(Variants::parse_prefill_gemm("").unwrap(), Some(DEFAULT_WGMMA));
        assert_eq!(Variants::parse_prefill_gemm("wgmma:128x256/3").unwrap().map(|c| c.bn), Some(256));
        for bad in ["wgmma:64x64/3", "fast", "wgmma:"] {
            assert!(Variants::parse_prefill_gemm(bad).unwrap_err().to_string().contains("CLEAVE_PREFILL_GEMM"));
        }
        assert_eq!(Variants::parse_prefill_fp8("mma").unwrap(), None);
        assert_eq!(Variants::parse_prefill_fp8("wgmma:3").unwrap(), Some(3));
        for bad in ["wgmma:9", "wgmma:x", "fast"] {
            assert!(Variants::parse_prefill_fp8(bad).unwrap_err().to_string().contains("CLEAVE_PREFILL_FP8"));
        }
        assert_eq!(Variants::parse_rows32("off").unwrap(), None);
        assert_eq!(Variants::parse_rows32("32x64/32/6/0").unwrap().map(|c| c.bn), Some(64));
        assert!(Variants::parse_rows32("32/64/6/0").unwrap_err().to_string().contains("CLEAVE_MOE_ROWS32"));
        assert!(Variants::parse_rows32("32x16/32/8/0").unwrap_err().to_string().contains("CLEAVE_MOE_ROWS32"));
        for (args, var) in [
            (("v5", "", "", "", ""), "CLEAVE_MLA_DECODE"),
            (("v3:8", "", "", "", ""), "CLEAVE_MLA_DECODE"),
            (("", "fast", "", "", ""), "CLEAVE_MOE_GEMM"),
            (("", "persistent:128/64/4/0", "", "", ""), "CLEAVE_MOE_GEMM"),
            (("", "", "flash", "", ""), "CLEAVE_PREFILL_ATTN"),
            (("", "", "", "fp4", ""), "CLEAVE_FP8_GEMM"),
            (("", "", "", "", "fast"), "CLEAVE_QGEMM"),
            (("", "", "", "", "persistent:64/64/3"), "CLEAVE_QGEMM"),
        ] {
            let e = Variants::parse(args.0, args.1, args.2, args.3, args.4).unwrap_err().to_string();
            assert!(e.contains(var), "{e}");
        }
    }
}
