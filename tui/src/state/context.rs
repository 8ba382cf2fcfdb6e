//! Where a trace entry or block came from, picked out of the recorded frames: its one-line
//! context ([`summary`]) and the readable lines of its stack ([`user_stack`]).
//!
//! Frames come in three kinds (innermost first, as PyTorch records them):
//! - **tags**: the user's step / phase labels (`step 41 forward`), recorded as frames with no
//!   source file (`??` or empty) and a name that is not a C++ symbol;
//! - **library frames**: the allocator's and framework's own C++ (`c10::...`, `*.cpp`) and
//!   Python (`site-packages/torch/...`) frames and the interpreter's C (`ceval.c`), which say nothing about the user's program;
//! - **user frames**: the rest (`model.py:101 forward`).
//!
//! The summary is the leading tags, then the innermost user frame (the innermost Python frame
//! with a file when every one is a library frame), then the entry's `user_metadata`, joined by
//! ` · `. memory_viz shows the whole stack on hover; one table column has room for this much.
//! The stack shows the leading tags, then every such site frame, innermost first.

use allocview_alloc::snapshot::Frame;

/// Separator between the parts of a summary.
pub const SEPARATOR: &str = " · ";

/// Path pieces that mark a frame as the framework's own, not the user's.
const LIBRARY_PATHS: [&str; 4] = ["site-packages", "dist-packages", "/torch/", "\\torch\\"];
/// Source suffixes of native frames: C (the Python interpreter's own), C++ and CUDA.
const NATIVE_SUFFIXES: [&str; 6] = [".c", ".cpp", ".cc", ".h", ".cu", ".cuh"];

fn has_file(f: &Frame) -> bool {
    !(f.filename.is_empty() || f.filename == "??")
}

fn is_native(f: &Frame) -> bool {
    f.name.contains("::") || NATIVE_SUFFIXES.iter().any(|s| f.filename.ends_with(s))
}

/// Whether a frame is a user's tag (`step 41 forward`).
pub fn is_tag(f: &Frame) -> bool {
    !has_file(f) && !f.name.is_empty() && !is_native(f)
}

/// Whether a frame is the framework's own.
pub fn is_library(f: &Frame) -> bool {
    is_native(f) || LIBRARY_PATHS.iter().any(|p| f.filename.contains(p))
}

/// `model.py:101 forward`: the file's base name (either path separator), line and function.
pub fn location(f: &Frame) -> String {
    let file = f.filename.rsplit(['/', '\\']).next().unwrap_or(&f.filename);
    format!("{file}:{} {}", f.line, f.name)
}

fn is_user(f: &Frame) -> bool {
    has_file(f) && !is_library(f)
}

/// The frames that say where the memory came from, innermost first: the user frames, or, when
/// every frame is a library frame, the Python ones with a file (the C++ ones name only the
/// framework).
fn sites(frames: &[Frame]) -> impl Iterator<Item = &Frame> {
    let any_user = frames.iter().any(is_user);
    frames.iter().filter(move |f| {
        if any_user {
            is_user(f)
        } else {
            has_file(f) && !is_native(f)
        }
    })
}

/// The leading tags (`step 41 forward`). Further in, a frame without a file is the
/// interpreter's or libc's C (`_PyEval_EvalFrameDefault`, `pymain_run_file`), not a label.
fn tags(frames: &[Frame]) -> impl Iterator<Item = &Frame> {
    frames.iter().take_while(|f| is_tag(f))
}

/// The one-line summary of `frames` and `user_metadata` (empty when there is nothing).
pub fn summary(frames: &[Frame], user_metadata: Option<&str>) -> String {
    let mut parts: Vec<String> = tags(frames).map(|f| f.name.clone()).collect();
    if let Some(f) = sites(frames).next() {
        parts.push(location(f));
    }
    if let Some(m) = user_metadata.filter(|m| !m.trim().is_empty()) {
        parts.push(m.trim().to_string());
    }
    parts.join(SEPARATOR)
}

/// The lines of a stack worth reading, innermost first, and how many other frames were left
/// out: the leading tags by name, then the user frames as [`location`]; when every frame is a
/// library frame, the Python ones with a file instead (as [`summary`] falls back), so a stack
/// with anything readable never shows only its tags or nothing.
pub fn user_stack(frames: &[Frame]) -> (Vec<String>, usize) {
    let lines: Vec<String> = tags(frames)
        .map(|f| f.name.clone())
        .chain(sites(frames).map(location))
        .collect();
    let hidden = frames.len() - lines.len();
    (lines, hidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_then_the_innermost_user_frame() {
        let f = [
            Frame::new("step 41 forward", "??", 0),
            Frame::new("layers.3", "model.py", 88),
            Frame::new("train", "train.py", 130),
        ];
        assert_eq!(summary(&f, None), "step 41 forward · model.py:88 layers.3");
    }

    #[test]
    fn framework_frames_are_skipped() {
        let f = [
            Frame::new("torch::unwind::unwind()", "??", 0),
            Frame::new(
                "c10::cuda::malloc(unsigned long)",
                "CUDACachingAllocator.cpp",
                0,
            ),
            Frame::new(
                "_call_impl",
                "D:\\venv\\Lib\\site-packages\\torch\\nn\\modules\\module.py",
                1790,
            ),
            Frame::new("forward", "D:\\Dev\\cs336_basics\\model.py", 101),
        ];
        assert_eq!(summary(&f, Some("  ")), "model.py:101 forward");
        assert_eq!(
            summary(&f, Some("phase=eval")),
            "model.py:101 forward · phase=eval"
        );
    }

    #[test]
    fn only_library_frames_still_name_a_python_place_and_nothing_gives_nothing() {
        let f = [
            Frame::new("torch::unwind::unwind()", "??", 0),
            Frame::new(
                "_call_impl",
                "/usr/lib/site-packages/torch/nn/module.py",
                1790,
            ),
        ];
        assert_eq!(summary(&f, None), "module.py:1790 _call_impl");
        assert_eq!(summary(&[], None), "");
        // A stack of them shows its Python ones too.
        assert_eq!(
            user_stack(&f),
            (vec!["module.py:1790 _call_impl".to_string()], 1)
        );
        assert_eq!(user_stack(&[]), (Vec::new(), 0));
    }

    #[test]
    fn a_stack_shows_tags_and_user_frames_and_counts_the_library_ones() {
        let f = [
            Frame::new("step 3 backward", "", 0),
            Frame::new("torch::unwind::unwind()", "??", 0),
            Frame::new(
                "c10::cuda::malloc(unsigned long)",
                "CUDACachingAllocator.cpp",
                0,
            ),
            Frame::new("_call_impl", "/venv/site-packages/torch/nn/module.py", 1790),
            Frame::new("forward", "/home/me/model.py", 101),
            Frame::new("PyEval_EvalFrameDefault", "ceval.c", 4200),
            Frame::new("_PyEval_EvalFrameDefault", "??", 0),
            Frame::new("pymain_run_file", "??", 0),
            Frame::new("main", "/home/me/train.py", 12),
        ];
        let (lines, hidden) = user_stack(&f);
        assert_eq!(
            lines,
            [
                "step 3 backward",
                "model.py:101 forward",
                "train.py:12 main"
            ]
        );
        assert_eq!(hidden, 6);
    }

    #[test]
    fn a_tag_over_only_library_frames_still_names_the_python_place() {
        let f = [
            Frame::new("step 1", "??", 0),
            Frame::new(
                "_call_impl",
                "/usr/lib/site-packages/torch/nn/module.py",
                1790,
            ),
        ];
        assert_eq!(summary(&f, None), "step 1 · module.py:1790 _call_impl");
        assert_eq!(
            user_stack(&f),
            (
                vec![
                    "step 1".to_string(),
                    "module.py:1790 _call_impl".to_string()
                ],
                0
            )
        );
    }
}
