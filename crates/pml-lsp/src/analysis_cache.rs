//! Analyses of open documents, computed on demand and kept until any document changes: a
//! prompt's diagnostics depend on its schema, which may be another open document, so the
//! workspace's generation, not the document's own version, says when one is stale. Kept apart
//! from the workspace so that analysing (which reads the workspace) never has to reach back here.

use crate::analysis::{Analysis, analyse};
use crate::uri::DocumentUri;
use crate::workspace::Workspace;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default)]
pub struct AnalysisCache {
    /// Each analysis with the workspace generation it was computed in.
    analyses: RefCell<HashMap<DocumentUri, (u64, Arc<Analysis>)>>,
}

impl AnalysisCache {
    /// The analysis of an open document of `workspace`; `None` when it is not open.
    pub fn get(&self, workspace: &Workspace, uri: &DocumentUri) -> Option<Arc<Analysis>> {
        let open = workspace.document(uri)?;
        let generation = workspace.generation();
        if let Some((computed_in, analysis)) = self.analyses.borrow().get(uri)
            && *computed_in == generation
        {
            return Some(Arc::clone(analysis));
        }
        let analysis = Arc::new(analyse(workspace, open));
        self.analyses
            .borrow_mut()
            .insert(uri.clone(), (generation, Arc::clone(&analysis)));
        Some(analysis)
    }

    /// Drops a closed document's analysis (it would never be read again, only kept).
    pub fn forget(&mut self, uri: &DocumentUri) {
        self.analyses.get_mut().remove(uri);
    }
}
