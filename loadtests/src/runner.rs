//! Sending a workload: arrival times (all at once, Poisson, or gamma with a burstiness shape),
//! a client-side concurrency cap, a progress bar, and the run's wall time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Gamma};
use tokio::sync::Semaphore;

use crate::client::{send_request, ApiClient, Endpoint, RequestInput, RequestOutput};

/// The server, endpoint and model a run talks to.
#[derive(Debug, Clone)]
pub struct Target {
    /// Connection pool and base URL.
    pub client: ApiClient,
    /// Completions or chat.
    pub endpoint: Endpoint,
    /// Full URL of the endpoint.
    pub api_url: String,
    /// The `model` field to send.
    pub model: String,
}

impl Target {
    /// Sends one request, timed from `epoch`.
    pub async fn send(&self, input: &RequestInput, epoch: Instant) -> RequestOutput {
        send_request(&self.client.http, &self.api_url, self.endpoint, &self.model, input, epoch).await
    }
}

/// How requests are released.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Requests per second; infinite sends everything at t = 0.
    pub request_rate: f64,
    /// Gamma shape of the gaps: 1 is Poisson, lower is burstier, higher is more regular.
    pub burstiness: f64,
    /// At most this many requests in flight (client-side semaphore).
    pub max_concurrency: Option<usize>,
    /// Seed of the arrival times.
    pub seed: u64,
}

/// Send offsets in seconds from the run's start, as vLLM's `get_request` draws them: gaps
/// from Gamma(shape = burstiness, scale = 1 / (rate * burstiness)), summed, then scaled so the
/// last request goes out at exactly `n / rate`. All zeros for an infinite rate.
pub fn arrival_offsets(n: usize, rate: f64, burstiness: f64, seed: u64) -> Result<Vec<f64>> {
    if rate.is_nan() || rate <= 0.0 {
        bail!("--request-rate must be positive, got {rate}");
    }
    if burstiness.is_nan() || burstiness <= 0.0 {
        bail!("--burstiness must be positive, got {burstiness}");
    }
    if rate.is_infinite() || n == 0 {
        return Ok(vec![0.0; n]);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut gaps: Vec<f64> = if burstiness.is_infinite() {
        vec![1.0 / rate; n]
    } else {
        let gamma = Gamma::new(burstiness, 1.0 / (rate * burstiness))?;
        (0..n).map(|_| gamma.sample(&mut rng)).collect()
    };
    for i in 1..n {
        gaps[i] += gaps[i - 1];
    }
    let last = gaps[n - 1];
    if last > 0.0 {
        let scale = (n as f64 / rate) / last;
        gaps.iter_mut().for_each(|t| *t *= scale);
    }
    Ok(gaps)
}

/// The outputs of a run, in input order, and its wall time.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// One per input, in input order.
    pub outputs: Vec<RequestOutput>,
    /// Seconds from the first release to the last completion.
    pub duration: f64,
}

/// A progress bar on stderr (drawn only when stderr is a terminal), or a hidden one.
pub fn progress_bar(len: usize, enabled: bool) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40.cyan/blue} {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}] {msg}",
    ) {
        pb.set_style(style);
    }
    pb
}

/// Releases `inputs` on the schedule of `load` and waits for all of them.
pub async fn run(target: &Target, inputs: Vec<RequestInput>, load: &LoadSpec, progress: bool) -> Result<RunOutcome> {
    if load.max_concurrency == Some(0) {
        bail!("--max-concurrency must be greater than 0");
    }
    let offsets = arrival_offsets(inputs.len(), load.request_rate, load.burstiness, load.seed)?;
    let sem = load.max_concurrency.map(|n| Arc::new(Semaphore::new(n)));
    let pb = progress_bar(inputs.len(), progress);
    let target = Arc::new(target.clone());
    let epoch = Instant::now();
    let mut tasks = Vec::with_capacity(inputs.len());
    for (input, offset) in inputs.into_iter().zip(offsets) {
        let due = epoch + Duration::from_secs_f64(offset);
        if due > Instant::now() {
            tokio::time::sleep_until(due.into()).await;
        }
        // Taking the permit here (not in the task) sends capped requests in input order, as
        // asyncio's FIFO semaphore does in vLLM; later arrivals queue behind it.
        let permit = match &sem {
            Some(s) => Some(s.clone().acquire_owned().await?),
            None => None,
        };
        let (target, pb) = (target.clone(), pb.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let out = target.send(&input, epoch).await;
            pb.inc(1);
            out
        }));
    }
    let mut outputs = Vec::with_capacity(tasks.len());
    for t in tasks {
        outputs.push(t.await?);
    }
    let duration = epoch.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(RunOutcome { outputs, duration })
}

/// vLLM's initial test run: sends `input` once and fails with the server's error if it fails.
/// With `timeout_s > 0` it retries until the endpoint answers or the time is up.
pub async fn ready_check(target: &Target, input: &RequestInput, timeout_s: f64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
    loop {
        let out = target.send(input, Instant::now()).await;
        if out.success {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "Initial test run failed - Please make sure benchmark arguments are correctly specified. Error: {}",
                out.error
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinite_rate_sends_everything_at_once() {
        assert_eq!(arrival_offsets(4, f64::INFINITY, 1.0, 0).unwrap(), vec![0.0; 4]);
    }

    #[test]
    fn poisson_offsets_are_increasing_and_end_at_n_over_rate() {
        let t = arrival_offsets(200, 4.0, 1.0, 3).unwrap();
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        assert!((t[199] - 50.0).abs() < 1e-9);
        // Mean gap 1/rate; exponential gaps have a coefficient of variation near 1.
        let gaps: Vec<f64> = std::iter::once(t[0]).chain(t.windows(2).map(|w| w[1] - w[0])).collect();
        let m = crate::metrics::mean(&gaps);
        let cv = crate::metrics::std_dev(&gaps) / m;
        assert!((m - 0.25).abs() < 1e-9);
        assert!((0.75..1.25).contains(&cv), "cv {cv}");
        assert_eq!(t, arrival_offsets(200, 4.0, 1.0, 3).unwrap(), "seeded");
    }

    #[test]
    fn burstiness_changes_the_spread_of_gaps() {
        let cv = |b: f64| {
            let t = arrival_offsets(2000, 10.0, b, 1).unwrap();
            let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
            crate::metrics::std_dev(&gaps) / crate::metrics::mean(&gaps)
        };
        // Gamma(k) gaps have CV 1/sqrt(k).
        assert!((cv(0.25) - 2.0).abs() < 0.4, "{}", cv(0.25));
        assert!((cv(4.0) - 0.5).abs() < 0.1, "{}", cv(4.0));
        let regular = arrival_offsets(5, 2.0, f64::INFINITY, 0).unwrap();
        for (i, t) in regular.iter().enumerate() {
            assert!((t - 0.5 * (i + 1) as f64).abs() < 1e-9);
        }
        assert!(arrival_offsets(3, 0.0, 1.0, 0).is_err());
        assert!(arrival_offsets(3, 1.0, 0.0, 0).is_err());
    }
}
