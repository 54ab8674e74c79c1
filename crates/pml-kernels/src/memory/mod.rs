//! The OS memory plumbing under the kernels and the model's weights: the allocator's treatment
//! of freed buffers, huge-page backed buffers, and files mapped read-only.

pub mod allocator;
pub mod huge_pages;
pub mod mapped;
