//! Metric families whose series are kept once per worker ([`crate::worker`]) and summed
//! when scraped: a request adds to its own worker's counters, on cache lines no other
//! worker writes, instead of every worker contending for one atomic per series. Every
//! series of a family exists from the start (the label sets are closed), so the
//! exposition does not depend on what traffic came.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

use crate::worker::PerWorker;

/// A family kept in an `Arc`, as the registry holds it.
pub struct Registered<C>(pub std::sync::Arc<C>);

impl<C: Collector> Collector for Registered<C> {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

/// A family's name, help and label sets, in series order.
struct Family {
    desc: Desc,
    /// Each series' label pairs, in the family's label-name order.
    series: Vec<Vec<LabelPair>>,
}

impl Family {
    fn new(
        name: &str,
        help: &str,
        labels: &[&str],
        values: &[Vec<&str>],
    ) -> Result<Family, prometheus::Error> {
        let desc = Desc::new(
            name.to_owned(),
            help.to_owned(),
            labels.iter().map(|l| (*l).to_owned()).collect(),
            Default::default(),
        )?;
        let series = values
            .iter()
            .map(|vals| {
                let mut pairs: Vec<LabelPair> = labels
                    .iter()
                    .zip(vals)
                    .map(|(n, v)| {
                        let mut pair = LabelPair::default();
                        pair.set_name((*n).to_owned());
                        pair.set_value((*v).to_owned());
                        pair
                    })
                    .collect();
                // In name order, as the library's own families show them.
                pairs.sort_by(|a, b| a.name().cmp(b.name()));
                pairs
            })
            .collect();
        Ok(Family { desc, series })
    }

    /// The family of `kind`, each series' metric filled in by `fill(index, metric)`.
    fn collect(
        &self,
        kind: MetricType,
        fill: impl Fn(usize, &mut proto::Metric),
    ) -> Vec<MetricFamily> {
        let metrics = self
            .series
            .iter()
            .enumerate()
            .map(|(i, labels)| {
                let mut m = proto::Metric::from_label(labels.clone());
                fill(i, &mut m);
                m
            })
            .collect();
        self.family(kind, metrics)
    }

    fn family(&self, kind: MetricType, metrics: Vec<proto::Metric>) -> Vec<MetricFamily> {
        let mut f = MetricFamily::default();
        f.set_name(self.desc.fq_name.clone());
        f.set_help(self.desc.help.clone());
        f.set_field_type(kind);
        f.set_metric(metrics);
        vec![f]
    }
}

fn zeros<T: Default>(n: usize) -> Box<[T]> {
    (0..n).map(|_| T::default()).collect()
}

/// Counters by series, per worker.
pub struct Counters {
    family: Family,
    values: PerWorker<Box<[AtomicU64]>>,
}

impl Counters {
    /// A family `name` with one series per entry of `values` (label values in `labels`
    /// order), for `workers` workers.
    pub fn new(
        name: &str,
        help: &str,
        labels: &[&str],
        values: &[Vec<&str>],
        workers: usize,
    ) -> Result<Counters, prometheus::Error> {
        let family = Family::new(name, help, labels, values)?;
        let n = family.series.len();
        Ok(Counters {
            family,
            values: PerWorker::new(workers, |_| zeros(n)),
        })
    }

    /// Adds `n` to series `series` (ignored past the last series).
    pub fn add(&self, series: usize, n: u64) {
        if let Some(v) = self.values.get().get(series) {
            v.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The total of series `series` over the workers.
    pub fn get(&self, series: usize) -> u64 {
        self.values
            .iter()
            .filter_map(|w| w.get(series))
            .map(|v| v.load(Ordering::Relaxed))
            .sum()
    }
}

impl Collector for Counters {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.family.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.family.collect(MetricType::COUNTER, |i, m| {
            let mut c = proto::Counter::default();
            c.set_value(self.get(i) as f64);
            m.set_counter(c);
        })
    }
}

/// One gauge without labels, kept as a per-worker difference and summed.
pub struct Gauge {
    family: Family,
    values: PerWorker<AtomicI64>,
}

impl Gauge {
    /// A gauge `name`, for `workers` workers.
    pub fn new(name: &str, help: &str, workers: usize) -> Result<Gauge, prometheus::Error> {
        Ok(Gauge {
            family: Family::new(name, help, &[], &[vec![]])?,
            values: PerWorker::new(workers, |_| AtomicI64::new(0)),
        })
    }

    /// Adds `n` (negative to take away) on the calling worker's shard.
    pub fn add(&self, n: i64) {
        self.values.get().fetch_add(n, Ordering::Relaxed);
    }

    /// The gauge's value: the sum of every worker's shard.
    pub fn get(&self) -> i64 {
        self.values.iter().map(|v| v.load(Ordering::Relaxed)).sum()
    }
}

impl Collector for Gauge {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.family.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut g = proto::Gauge::default();
        g.set_value(self.get() as f64);
        let metrics = vec![proto::Metric::from_gauge(g)];
        self.family.family(MetricType::GAUGE, metrics)
    }
}

/// One series' bucket counts (the last one past every bound) and sum.
struct Cell {
    counts: Box<[AtomicU64]>,
    /// The sum of observations, as `f64` bits.
    sum: AtomicU64,
}

/// Histograms by series, per worker.
pub struct Histograms {
    family: Family,
    bounds: Vec<f64>,
    values: PerWorker<Box<[Cell]>>,
}

impl Histograms {
    /// A family `name` with bucket upper bounds `bounds` (ascending) and one series
    /// per entry of `values`, for `workers` workers.
    pub fn new(
        name: &str,
        help: &str,
        bounds: &[f64],
        labels: &[&str],
        values: &[Vec<&str>],
        workers: usize,
    ) -> Result<Histograms, prometheus::Error> {
        let family = Family::new(name, help, labels, values)?;
        let n = family.series.len();
        let buckets = bounds.len() + 1;
        Ok(Histograms {
            family,
            bounds: bounds.to_vec(),
            values: PerWorker::new(workers, |_| {
                (0..n)
                    .map(|_| Cell {
                        counts: zeros(buckets),
                        sum: AtomicU64::new(0),
                    })
                    .collect()
            }),
        })
    }

    /// Records `v` in series `series` (ignored past the last series).
    pub fn observe(&self, series: usize, v: f64) {
        let Some(cell) = self.values.get().get(series) else {
            return;
        };
        // The first bucket whose bound is at least `v` (NaN: past every bound).
        let bucket = if v.is_nan() {
            self.bounds.len()
        } else {
            self.bounds.partition_point(|b| *b < v)
        };
        if let Some(c) = cell.counts.get(bucket) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        // Only this worker writes its cell, so this loop does not spin in practice.
        let _ = cell
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    /// Series `series` over the workers: the count of each bucket (the last past every
    /// bound) and the sum.
    pub fn get(&self, series: usize) -> (Vec<u64>, f64) {
        let mut counts = vec![0u64; self.bounds.len() + 1];
        let mut sum = 0.0;
        for cell in self.values.iter().filter_map(|w| w.get(series)) {
            for (total, c) in counts.iter_mut().zip(cell.counts.iter()) {
                *total += c.load(Ordering::Relaxed);
            }
            sum += f64::from_bits(cell.sum.load(Ordering::Relaxed));
        }
        (counts, sum)
    }
}

impl Collector for Histograms {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.family.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.family.collect(MetricType::HISTOGRAM, |i, m| {
            let (counts, sum) = self.get(i);
            let mut cumulative = 0u64;
            let buckets = self
                .bounds
                .iter()
                .zip(&counts)
                .map(|(bound, c)| {
                    cumulative += c;
                    let mut b = proto::Bucket::default();
                    b.set_upper_bound(*bound);
                    b.set_cumulative_count(cumulative);
                    b
                })
                .collect();
            let mut h = proto::Histogram::default();
            // The count is the buckets' total, so `+Inf` always equals it.
            h.set_sample_count(counts.iter().sum());
            h.set_sample_sum(sum);
            h.set_bucket(buckets);
            m.set_histogram(h);
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use prometheus::{Encoder, Registry, TextEncoder};

    fn text(c: impl Collector + 'static) -> String {
        let registry = Registry::new();
        registry.register(Box::new(c)).unwrap();
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    fn on_worker<R: Send>(w: usize, f: impl FnOnce() -> R + Send) -> R {
        std::thread::scope(|s| {
            s.spawn(|| {
                crate::worker::enter(w);
                f()
            })
            .join()
            .unwrap()
        })
    }

    #[test]
    fn counters_sum_every_worker_and_show_every_series() {
        let c = Counters::new("t_total", "help", &["kind"], &[vec!["a"], vec!["b"]], 3).unwrap();
        let two = Counters::new("t2_total", "help", &["z", "a"], &[vec!["1", "2"]], 1).unwrap();
        two.add(0, 1);
        assert!(
            text(two).contains("t2_total{a=\"2\",z=\"1\"} 1\n"),
            "labels in name order"
        );
        c.add(0, 1);
        on_worker(1, || c.add(0, 2));
        on_worker(2, || c.add(0, 4));
        c.add(7, 1);
        assert_eq!((c.get(0), c.get(1)), (7, 0));
        assert_eq!(
            text(c),
            "# HELP t_total help\n# TYPE t_total counter\nt_total{kind=\"a\"} 7\nt_total{kind=\"b\"} 0\n"
        );
    }

    #[test]
    fn a_gauge_raised_on_one_worker_and_lowered_on_another_sums_to_zero() {
        let g = Gauge::new("t_gauge", "help", 2).unwrap();
        g.add(1);
        g.add(1);
        on_worker(1, || g.add(-1));
        assert_eq!(g.get(), 1);
        g.add(-1);
        assert_eq!(g.get(), 0);
        assert!(text(g).ends_with("t_gauge 0\n"));
    }

    #[test]
    fn histograms_read_as_the_library_writes_them() {
        let bounds = [0.5, 1.0, 2.5];
        let ours = Histograms::new("t_seconds", "help", &bounds, &["s"], &[vec!["x"]], 2).unwrap();
        let theirs = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("t_seconds", "help").buckets(bounds.to_vec()),
            &["s"],
        )
        .unwrap();
        for (w, v) in [
            (0, 0.25),
            (1, 0.5),
            (0, 0.75),
            (1, 1.0),
            (0, 2.0),
            (1, 3.0),
            (0, 9.0),
        ] {
            on_worker(w, || ours.observe(0, v));
            theirs.with_label_values(&["x"]).observe(v);
        }
        assert_eq!(text(ours), text(theirs));
    }
}
