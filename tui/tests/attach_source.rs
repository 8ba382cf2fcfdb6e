//! The attach source over an agent in this process (on a socket of its own): the update rate
//! it reports is the agent's, by the agent's clock, even when the dashboard read its updates
//! in one burst (held up by a slow terminal, it polls late and finds many waiting).

use std::time::Duration;

use allocview::source::Source;
use allocview::source::attach::AttachSource;
use allocview::state::State;
use allocview_agent::agent::Agent;

/// The agent's tick (its default): at most 10 updates a second.
const TICK: Duration = Duration::from_millis(100);

#[test]
fn the_rate_of_updates_read_in_a_burst_is_the_agents_not_the_burst() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("unix:{}", dir.path().join("agent.sock").display());
    let agent = Agent::builder()
        .listen(addr.clone())
        .dump_dir(dir.path().join("dumps"))
        .tick(TICK)
        .spawn()
        .unwrap();
    let mut src = AttachSource::connect(&addr, None).unwrap();
    let mut state = State::default();
    // Held up: a dozen ticks' updates wait, then one poll reads them all.
    std::thread::sleep(TICK * 12);
    assert!(src.poll(&mut state).unwrap());
    let hz = state.source.rate_hz.expect("a rate after several updates");
    let max_hz = 1.0 / TICK.as_secs_f64();
    assert!(hz > 0.0 && hz <= max_hz * 1.5, "{hz} Hz");
    agent.shutdown();
}
