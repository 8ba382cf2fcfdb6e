//! Context ids end to end: a caching allocator that records where its blocks come from
//! publishes ids; the agent resolves them through the allocator and names their frames in its
//! state and in the updates its clients apply.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_agent::protocol::{StateUpdate, apply_update};
use allocview_agent::state::{AgentState, ContextFrames, DeviceState};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, ContextLevel, HistoryOptions};
use allocview_alloc::snapshot::{Frame, Frames};

fn frames(tag: &str) -> Frames {
    Arc::from(vec![
        Frame::new(tag, "??", 0),
        Frame::new("train", "train.py", 130),
    ])
}

#[test]
fn the_agent_names_the_frames_of_the_context_ids_its_recent_events_carry() {
    let dir = tempfile::tempdir().unwrap();
    let alloc = Arc::new(CachingAllocator::new(
        SimBackend::new(1 << 30),
        AllocatorConfig::default(),
    ));
    let site = Arc::new(Mutex::new(frames("step 1 forward")));
    let s2 = site.clone();
    alloc.set_context_provider(Some(Arc::new(move || s2.lock().unwrap().clone())));
    alloc.record_history(HistoryOptions {
        enabled: true,
        context: ContextLevel::Alloc,
        ..HistoryOptions::default()
    });
    let agent = Agent::builder()
        .no_listen()
        .dump_dir(dir.path())
        .tick(Duration::from_millis(5))
        .provider(alloc.clone())
        .spawn()
        .unwrap();
    alloc.set_event_sink(Some(agent.sink()));
    let a = alloc.malloc(4096, StreamId::DEFAULT).unwrap();
    *site.lock().unwrap() = frames("step 1 backward");
    let b = alloc.malloc(1 << 20, StreamId::DEFAULT).unwrap();
    alloc.free(a).unwrap();
    agent.flush();
    let state = agent.state();
    let d = &state.devices[0];
    let tag = |id: u32| -> String {
        let c = d
            .contexts
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("context {id} is named: {:?}", d.contexts));
        c.frames[0].name.clone()
    };
    let by_action: Vec<(&str, u32)> = d
        .recent
        .iter()
        .filter(|e| e.action == "alloc" || e.action == "free")
        .map(|e| (e.action.as_str(), e.context))
        .collect();
    assert_eq!(by_action.len(), 3, "{:?}", d.recent);
    assert_eq!(tag(by_action[0].1), "step 1 forward");
    assert_eq!(tag(by_action[1].1), "step 1 backward");
    assert_eq!(
        by_action[2],
        ("free", by_action[0].1),
        "the free carries its allocation's context"
    );
    assert_eq!(d.contexts.len(), 2, "each id once");
    alloc.free(b).unwrap();
}

#[test]
fn a_client_keeps_the_frames_its_recent_events_use_and_forgets_the_rest() {
    let recent = |seq: u64, context: u32| allocview_agent::state::RecentEvent {
        seq,
        time_ns: seq,
        action: "alloc".into(),
        addr: 0x1000 * seq,
        size: 512,
        requested: 512,
        stream: 0,
        pool: allocview_agent::state::PoolKey::Small,
        flags: 0,
        latency_ns: 0,
        context,
    };
    let named = |id: u32, tag: &str| ContextFrames {
        id,
        frames: frames(tag),
    };
    let mut state = AgentState {
        devices: vec![DeviceState {
            recent: vec![recent(1, 1), recent(2, 2)],
            contexts: vec![named(1, "a"), named(2, "b")],
            ..DeviceState::default()
        }],
        ..AgentState::default()
    };
    // Enough new events to push the first two out of a client's tail.
    let n = allocview_agent::protocol::CLIENT_RECENT_EVENTS as u64;
    let mut update = StateUpdate::default();
    update
        .devices
        .push(allocview_agent::protocol::DeviceUpdate {
            device: 0,
            recent: (3..3 + n)
                .map(|s| recent(s, if s == 3 { 2 } else { 3 }))
                .collect(),
            contexts: vec![named(2, "b"), named(3, "c")],
            ..Default::default()
        });
    apply_update(&mut state, &update);
    let d = &state.devices[0];
    assert_eq!(d.recent.len() as u64, n);
    assert_eq!(
        d.contexts.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![2, 3],
        "1 is no longer used"
    );
    // Through the wire format too.
    let json = serde_json::to_string(&update).unwrap();
    let back: StateUpdate = serde_json::from_str(&json).unwrap();
    assert_eq!(back, update);
}
