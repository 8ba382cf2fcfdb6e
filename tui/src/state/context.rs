//! The one-line context of a trace entry or block: what the user would call "where it came
//! from", picked out of the recorded frames.
//!
//! Frames come in three kinds (innermost first, as PyTorch records them):
//! - **tags**: the user's step / phase labels (`step 41 forward`), recorded as frames with no
//!   source file (`??` or empty) and a name that is not a C++ symbol;
//! - **library frames**: the allocator's and framework's own C++ (`c10::...`, `*.cpp`) and
//!   Python (`site-packages/torch/...`) frames and the interpreter's C (`ceval.c`), which say nothing about the user's program;
//! - **user frames**: the rest (`model.py:101 forward`).
//!
//! The summary is the leading tags, then the innermost user frame (the innermost frame with a
//! file when every one is a library frame), then the entry's `user_metadata`, joined by ` · `.
//! memory_viz shows the whole stack on hover; one table column has room for this much.

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

/// The one-line summary of `frames` and `user_metadata` (empty when there is nothing).
pub fn summary(frames: &[Frame], user_metadata: Option<&str>) -> String {
    let mut parts: Vec<String> = frames
        .iter()
        .take_while(|f| is_tag(f))
        .map(|f| f.name.clone())
        .collect();
    let site = frames
        .iter()
        .find(|f| has_file(f) && !is_library(f))
        .or_else(|| frames.iter().find(|f| has_file(f) && !is_native(f)));
    if let Some(f) = site {
        parts.push(location(f));
    }
    if let Some(m) = user_metadata.filter(|m| !m.trim().is_empty()) {
        parts.push(m.trim().to_string());
    }
    parts.join(SEPARATOR)
}

/// The lines of a stack worth reading, innermost first, and how many other frames were left
/// out: the leading tags by name and user frames as [`location`]. When every frame is a library frame,
/// the Python ones with a file are shown instead (as [`summary`] falls back), so a stack with
/// anything readable never shows as empty.
pub fn user_stack(frames: &[Frame]) -> (Vec<String>, usize) {
    let line = |f: &Frame| {
        if has_file(f) {
            location(f)
        } else {
            f.name.clone()
        }
    };
    // Tags lead (as in `summary`): further in, a frame without a file is the interpreter's
    // or libc's C (`_PyEval_EvalFrameDefault`, `pymain_run_file`), not a label.
    let tags = frames.iter().take_while(|f| is_tag(f)).count();
    let mut lines: Vec<String> = frames[..tags]
        .iter()
        .chain(
            frames[tags..]
                .iter()
                .filter(|f| has_file(f) && !is_library(f)),
        )
        .map(line)
        .collect();
    if lines.is_empty() {
        lines = frames
            .iter()
            .filter(|f| has_file(f) && !is_native(f))
            .map(line)
            .collect();
    }
    let hidden = frames.len() - lines.len();
    (lines, hidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, filename: &str, line: i64) -> Frame {
        Frame {
            name: name.into(),
            filename: filename.into(),
            line,
        }
    }

    #[test]
    fn tags_then_the_innermost_user_frame() {
        let f = [
            frame("step 41 forward", "??", 0),
            frame("layers.3", "model.py", 88),
            frame("train", "train.py", 130),
        ];
        assert_eq!(summary(&f, None), "step 41 forward · model.py:88 layers.3");
    }

    #[test]
    fn framework_frames_are_skipped() {
        let f = [
            frame("torch::unwind::unwind()", "??", 0),
            frame(
                "c10::cuda::malloc(unsigned long)",
                "CUDACachingAllocator.cpp",
                0,
            ),
            frame(
                "_call_impl",
                "D:\\venv\\Lib\\site-packages\\torch\\nn\\modules\\module.py",
                1790,
            ),
            frame("forward", "D:\\Dev\\cs336_basics\\model.py", 101),
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
            frame("torch::unwind::unwind()", "??", 0),
            frame(
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
            frame("step 3 backward", "", 0),
            frame("torch::unwind::unwind()", "??", 0),
            frame(
                "c10::cuda::malloc(unsigned long)",
                "CUDACachingAllocator.cpp",
                0,
            ),
            frame("_call_impl", "/venv/site-packages/torch/nn/module.py", 1790),
            frame("forward", "/home/me/model.py", 101),
            frame("PyEval_EvalFrameDefault", "ceval.c", 4200),
            frame("_PyEval_EvalFrameDefault", "??", 0),
            frame("pymain_run_file", "??", 0),
            frame("main", "/home/me/train.py", 12),
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
}
