//! User filters on the message path (`plugins.filters`): one stage at every site, which
//! calls the filters of that site's hooks in YAML order, once per batch each, and applies
//! their verdicts.
//!
//! - Origin: `on_send`, then `on_route` (which may set the recipients: placement, and so the
//!   static routes, come after it), then `on_deliver` for messages whose recipients are all on
//!   this node; all before the codec stages, so filters see payloads as written.
//! - Relay: `on_forward`. Destination: `on_deliver`, before the message is queued.
//! - A message whose payload is encoded (compressed or sealed end to end) is shown without
//!   its payload and may only pass or be dropped: its payload and headers are bound by its
//!   origin. System messages (events, results, probes) never meet a filter.
//!
//! The running chain is replaced whole by [`Filters::reload`]; stages read it once per batch,
//! so a reload takes effect at the next batch and nothing in flight is lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use linkbus_plugin_api::message::{check_headers, check_recipients};
use linkbus_plugin_api::registry::{BuildContext, Builder, Registry};
use linkbus_plugin_api::{
    FailureKind, Filter, FilterError, HeaderChange, Hook, Message, PluginError, Verdict,
};

use super::refusal::RefusalCode;
use super::stages::{Site, Stage, StageBatch, StageContext, StageFactory};
use crate::config::{Config, DropPolicy, FailurePolicy, FilterChoice};

/// Buckets of the call-time histogram: a quarter octave each, from 1 µs to about 18 minutes.
const TIME_BUCKETS: usize = 120;

/// What one filter did since it was built.
#[derive(Debug)]
struct Counts {
    calls: AtomicU64,
    messages: AtomicU64,
    drops: AtomicU64,
    rewrites: AtomicU64,
    routes: AtomicU64,
    failures: [AtomicU64; FailureKind::ALL.len()],
    fuel: AtomicU64,
    times: [AtomicU64; TIME_BUCKETS],
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            calls: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            rewrites: AtomicU64::new(0),
            routes: AtomicU64::new(0),
            failures: std::array::from_fn(|_| AtomicU64::new(0)),
            fuel: AtomicU64::new(0),
            times: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The histogram bucket of a call that took `took`.
fn bucket(took: Duration) -> usize {
    let micros = took.as_micros().max(1) as f64;
    ((micros.log2() * 4.0) as usize).min(TIME_BUCKETS - 1)
}

/// The upper bound of histogram bucket `index`, in microseconds.
fn bucket_micros(index: usize) -> u64 {
    2f64.powf((index + 1) as f64 / 4.0).ceil() as u64
}

impl Counts {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The time at quantile `q` (0..1) of the calls so far, in microseconds (an upper bound).
    fn quantile_micros(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.times.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_micros(index);
            }
        }
        bucket_micros(TIME_BUCKETS - 1)
    }
}

/// What a filter did since it was built (`linkbus status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterStats {
    /// Its configured name.
    pub name: String,
    /// Its hooks.
    pub hooks: Vec<Hook>,
    /// Calls (one per batch).
    pub calls: u64,
    /// Messages it was shown.
    pub messages: u64,
    /// Messages it dropped.
    pub drops: u64,
    /// Messages it changed (payload or headers).
    pub rewrites: u64,
    /// Messages it routed (`on_route`).
    pub routes: u64,
    /// Failed calls (or verdicts) by kind, only the kinds that happened.
    pub failures: Vec<(FailureKind, u64)>,
    /// Fuel used, in all.
    pub fuel: u64,
    /// Time per call at the median and the 99th percentile, in microseconds (upper bounds).
    pub p50_us: u64,
    /// See `p50_us`.
    pub p99_us: u64,
    /// How many times its instance was rebuilt after repeated failures.
    pub rebuilds: u64,
    /// Its own counters (a guest's `counter_add`).
    pub counters: Vec<(String, i64)>,
}

/// One filter of the running chain.
struct Running {
    choice: FilterChoice,
    filter: Arc<dyn Filter>,
    counts: Arc<Counts>,
}

impl Running {
    fn stats(&self) -> FilterStats {
        let c = &self.counts;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FilterStats {
            name: self.choice.name.clone(),
            hooks: self.choice.hooks.clone(),
            calls: load(&c.calls),
            messages: load(&c.messages),
            drops: load(&c.drops),
            rewrites: load(&c.rewrites),
            routes: load(&c.routes),
            failures: FailureKind::ALL
                .into_iter()
                .zip(&c.failures)
                .map(|(kind, n)| (kind, load(n)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            fuel: load(&c.fuel),
            p50_us: c.quantile_micros(0.5),
            p99_us: c.quantile_micros(0.99),
            rebuilds: self.filter.rebuilds(),
            counters: self.filter.counters(),
        }
    }
}

/// The running chain: replaced whole on reload.
#[derive(Default)]
struct Chain {
    filters: Vec<Running>,
}

/// The node's filters, as configured, and the stage that runs them.
pub struct Filters {
    chain: RwLock<Arc<Chain>>,
    /// Whether the running chain has no filter: what every batch asks first, without the
    /// lock.
    empty: AtomicBool,
    context: BuildContext,

    /// Largest payload a filter may write (`messages.message_bytes_max`).
    payload_bytes_max: usize,
}

impl std::fmt::Debug for Filters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let chain = self.current();
        f.debug_list().entries(chain.filters.iter().map(|r| &r.choice.name)).finish()
    }
}

impl Filters {
    /// The filters of `config.plugins.filters`, built from the registry.
    ///
    /// # Errors
    /// The first filter that does not build, named.
    pub(crate) fn build(config: &Config) -> Result<Arc<Self>, PluginError> {
        let filters = Self {
            chain: RwLock::default(),
            empty: AtomicBool::new(true),
            context: BuildContext { node: config.node.name.clone(), data_dir: config.node.data_dir.clone() },
            payload_bytes_max: usize::try_from(config.messages.message_bytes_max).unwrap_or(usize::MAX),
        };
        let chain =
            filters.build_chain(&config.plugins.filters, &config.plugins.registry, &Chain::default())?;
        filters.replace(chain);
        Ok(Arc::new(filters))
    }

    /// The chain for `choices`: a filter configured as before, built from what is still
    /// current, is kept (with its state and counts); the others are built anew.
    fn build_chain(
        &self,
        choices: &[FilterChoice],
        registry: &Registry,
        old: &Chain,
    ) -> Result<Chain, PluginError> {
        let mut filters = Vec::with_capacity(choices.len());
        for choice in choices {
            let kept = old.filters.iter().find(|r| r.choice == *choice && r.filter.is_current());
            if let Some(kept) = kept {
                filters.push(Running {
                    choice: choice.clone(),
                    filter: kept.filter.clone(),
                    counts: kept.counts.clone(),
                });
                continue;
            }
            let failed = |reason: String| PluginError { plugin: format!("filter '{}'", choice.name), reason };
            let filter = match registry
                .find("filter", &choice.kind, choice.library_path())
                .map(|p| &p.builder)
            {
                Some(Builder::Filter(build)) => build(&choice.section, &self.context)
                    .map_err(|e| failed(format!("{}: {}", e.plugin, e.reason)))?,
                _ => return Err(failed(format!("no filter plugin named '{}' in this build", choice.kind))),
            };
            filters.push(Running {
                choice: choice.clone(),
                filter: Arc::from(filter),
                counts: Arc::default(),
            });
        }
        Ok(Chain { filters })
    }

    /// Makes `chain` the running one.
    fn replace(&self, chain: Chain) {
        let empty = chain.filters.is_empty();
        *self.chain.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(chain);
        self.empty.store(empty, Ordering::Release);
    }

    fn current(&self) -> Arc<Chain> {
        self.chain.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Takes up `choices`: every filter is built (or kept) first; one that fails leaves the
    /// whole running chain as it is. Returns a line on what runs now (none when there were
    /// and are no filters).
    ///
    /// # Errors
    /// Why a filter does not build, named.
    pub(crate) fn reload(
        &self,
        choices: &[FilterChoice],
        registry: &Registry,
    ) -> Result<Option<String>, String> {
        let old = self.current();
        if old.filters.is_empty() && choices.is_empty() {
            return Ok(None);
        }
        let chain = self.build_chain(choices, registry, &old).map_err(|e| e.to_string())?;
        let kept =
            chain.filters.iter().filter(|r| old.filters.iter().any(|o| Arc::ptr_eq(&o.filter, &r.filter)));
        let kept = kept.count();
        let line = format!(
            "filters reloaded: {} running ({} kept, {} new)",
            chain.filters.len(),
            kept,
            chain.filters.len() - kept
        );
        self.replace(chain);
        Ok(Some(line))
    }

    /// What each running filter did.
    pub(crate) fn stats(&self) -> Vec<FilterStats> {
        self.current().filters.iter().map(Running::stats).collect()
    }

    /// Each running filter's name, plugin and code origin (`linkbus plugins`).
    pub(crate) fn origins(&self) -> Vec<(String, String, linkbus_plugin_api::Origin)> {
        let chain = self.current();
        chain
            .filters
            .iter()
            .map(|r| (r.choice.name.clone(), r.choice.kind.clone(), r.filter.origin()))
            .collect()
    }

    /// The stage factory that runs the filters at every site.
    pub(crate) fn stage(self: &Arc<Self>) -> Arc<dyn StageFactory> {
        Arc::new(FilterStages(self.clone()))
    }
}

/// Builds the filter stage of each task.
struct FilterStages(Arc<Filters>);

impl StageFactory for FilterStages {
    fn name(&self) -> &str {
        "filters"
    }

    fn build(&self, context: &StageContext<'_>) -> Option<Box<dyn Stage>> {
        Some(Box::new(FilterStage {
            filters: self.0.clone(),
            site: context.site,
            node: context.node.clone(),
        }))
    }
}

/// The filter stage of one task.
struct FilterStage {
    filters: Arc<Filters>,
    site: Site,
    node: linkbus_plugin_api::NodeName,
}

impl Stage for FilterStage {
    fn is_idle(&self) -> bool {
        self.filters.empty.load(Ordering::Acquire)
    }

    fn run(&mut self, batch: &mut StageBatch<'_, '_>) {
        let chain = self.filters.current();
        if chain.filters.is_empty() {
            return;
        }
        let hooks: &[Hook] = match self.site {
            Site::Origin => &[Hook::OnSend, Hook::OnRoute, Hook::OnDeliver],
            Site::Relay => &[Hook::OnForward],
            Site::Delivery => &[Hook::OnDeliver],
        };
        for &hook in hooks {
            for running in chain.filters.iter().filter(|r| r.choice.runs_at(hook)) {
                let call = Call { running, hook, site: self.site, node: &self.node, filters: &self.filters };
                call.run(batch);
            }
        }
    }
}

/// One filter's call at one hook over a batch.
struct Call<'a> {
    running: &'a Running,
    hook: Hook,
    site: Site,
    node: &'a linkbus_plugin_api::NodeName,
    filters: &'a Filters,
}

impl Call<'_> {
    /// Whether the message is one for this call: a user message, not refused yet, to a
    /// recipient the filter applies to (at the origin's `on_deliver`, all of them here).
    fn shown(&self, message: &Message) -> bool {
        let recipients = &message.content.recipients;
        let to = &self.running.choice.to;
        !message.content.priority.is_system()
            && (to.is_empty() || recipients.iter().any(|r| to.iter().any(|p| p.matches(r))))
            && (self.site != Site::Origin
                || self.hook != Hook::OnDeliver
                || recipients.iter().all(|r| &r.node == self.node))
    }

    fn run(&self, batch: &mut StageBatch<'_, '_>) {
        let picked: Vec<usize> = (0..batch.messages().len())
            .filter(|&i| !batch.is_refused(i) && self.shown(batch.messages()[i]))
            .collect();
        if picked.is_empty() {
            return;
        }
        let counts = &self.running.counts;
        let started = Instant::now();
        let decided = {
            let messages = batch.messages();
            let shown: Vec<&Message> = picked.iter().map(|&i| &*messages[i]).collect();
            self.running.filter.filter(self.hook, &shown)
        };
        Counts::add(&counts.times[bucket(started.elapsed())], 1);
        Counts::add(&counts.calls, 1);
        Counts::add(&counts.messages, picked.len() as u64);
        let decision = decided.and_then(|d| {
            if d.verdicts.len() == picked.len() {
                Ok(d)
            } else {
                let said = format!("{} verdicts for {} messages", d.verdicts.len(), picked.len());
                Err(FilterError::new(FailureKind::Output, said))
            }
        });
        match decision {
            Ok(decision) => {
                Counts::add(&counts.fuel, decision.fuel);
                for (&index, verdict) in picked.iter().zip(decision.verdicts) {
                    if let Err(error) = self.apply(batch, index, verdict) {
                        self.failed(batch, &[index], &error);
                    }
                }
            }
            Err(error) => self.failed(batch, &picked, &error),
        }
    }

    /// Applies `verdict` to the message at `index`.
    fn apply(
        &self,
        batch: &mut StageBatch<'_, '_>,
        index: usize,
        verdict: Verdict,
    ) -> Result<(), FilterError> {
        let name = &self.running.choice.name;
        let counts = &self.running.counts;
        match verdict {
            Verdict::Pass => Ok(()),
            Verdict::Drop { reason } => {
                Counts::add(&counts.drops, 1);
                let reason = format!("filter '{name}' dropped it at {}: {reason}", self.hook);
                let code = match (self.site, self.running.choice.drops) {
                    (Site::Origin, _) | (_, DropPolicy::DeadLetter) => RefusalCode::Filtered,
                    (_, DropPolicy::Discard) => RefusalCode::Dropped,
                };
                batch.mark_as(index, code, reason);
                Ok(())
            }
            Verdict::Change { payload, headers } => {
                let message = &mut *batch.messages()[index];
                change(message, payload, headers, self.filters.payload_bytes_max)?;
                Counts::add(&counts.rewrites, 1);
                Ok(())
            }
            Verdict::Route(recipients) if self.hook == Hook::OnRoute => {
                let mut to = linkbus_plugin_api::Recipients::new();
                for address in recipients {
                    if !to.contains(&address) {
                        to.push(address);
                    }
                }
                check_recipients(&to)
                    .map_err(|e| FilterError::new(FailureKind::Output, format!("its route: {e}")))?;
                batch.messages()[index].content.recipients = to;
                batch.rerouted();
                Counts::add(&counts.routes, 1);
                Ok(())
            }
            Verdict::Route(_) => Err(FilterError::new(
                FailureKind::Output,
                format!("set recipients at {}, not on_route", self.hook),
            )),
        }
    }

    /// Applies the failure policy to the messages at `indexes`, after `error`.
    fn failed(&self, batch: &mut StageBatch<'_, '_>, indexes: &[usize], error: &FilterError) {
        let choice = &self.running.choice;
        let counts = &self.running.counts;
        let seen = counts.failures[FailureKind::ALL.iter().position(|k| *k == error.kind).unwrap_or(0)]
            .fetch_add(1, Ordering::Relaxed);
        // The first few, then one in a thousand.
        if seen < 5 || seen.is_multiple_of(1000) {
            tracing::warn!(
                filter = %choice.name,
                hook = %self.hook,
                kind = error.kind.as_str(),
                policy = choice.on_failure.as_str(),
                failures = seen + 1,
                "Filter failed: {error}."
            );
        }
        let reason = format!(
            "filter '{}' failed at {} ({}): {error}",
            choice.name,
            self.hook,
            choice.on_failure.as_str()
        );
        let code = match (self.site, choice.on_failure) {
            (_, FailurePolicy::FailOpen) => return,
            (Site::Origin, _) | (_, FailurePolicy::DeadLetter) => RefusalCode::StageFailed,
            (_, FailurePolicy::FailClosed) => RefusalCode::Dropped,
        };
        for &index in indexes {
            batch.mark_as(index, code, reason.clone());
        }
    }
}

/// Applies a change verdict to `message`: the payload, then the header changes; the result
/// must be within the message limits (nothing changes otherwise). Only the headers are
/// copied, and only when the verdict changes some.
fn change(
    message: &mut Message,
    payload: Option<bytes::Bytes>,
    headers: Vec<HeaderChange>,
    payload_bytes_max: usize,
) -> Result<(), FilterError> {
    let bad = |what: String| FilterError::new(FailureKind::Output, what);
    if message.is_encoded() {
        return Err(bad(
            "changed a message whose payload is encoded end to end (it may only pass or drop it)".into(),
        ));
    }
    if let Some(payload) = &payload
        && payload.len() > payload_bytes_max
    {
        return Err(bad(format!(
            "wrote a payload of {} bytes, over messages.message_bytes_max ({payload_bytes_max})",
            payload.len()
        )));
    }
    if !headers.is_empty() {
        message.content.headers = changed_headers(&message.content.headers, headers).map_err(bad)?;
    }
    if let Some(payload) = payload {
        message.content.payload = payload;
    }
    Ok(())
}

/// `headers` with `changes` applied in order, checked against the header limits.
fn changed_headers(
    headers: &[(String, String)],
    changes: Vec<HeaderChange>,
) -> Result<Vec<(String, String)>, String> {
    let mut headers = headers.to_vec();
    for change in changes {
        let key = match &change {
            HeaderChange::Set(key, _) | HeaderChange::Remove(key) => key,
        };
        if key.starts_with("linkbus.") {
            return Err(format!("changed header '{key}': the linkbus.* headers are the node's"));
        }
        match change {
            HeaderChange::Set(key, value) => match headers.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => *v = value,
                None => headers.push((key, value)),
            },
            HeaderChange::Remove(key) => headers.retain(|(k, _)| *k != key),
        }
    }
    check_headers(&headers).map_err(|e| format!("its change: {e}"))?;
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_times_fall_in_quarter_octaves() {
        let counts = Counts::default();
        for micros in [1, 2, 3, 10, 10, 10, 10, 10, 10, 5000] {
            Counts::add(&counts.times[bucket(Duration::from_micros(micros))], 1);
        }
        let p50 = counts.quantile_micros(0.5);
        assert!((10..=12).contains(&p50), "{p50}");
        let p99 = counts.quantile_micros(0.99);
        assert!((5000..=6000).contains(&p99), "{p99}");
        assert_eq!(Counts::default().quantile_micros(0.5), 0);
    }
}
