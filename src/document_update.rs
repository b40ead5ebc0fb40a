//! [`DocumentUpdate`] and the checks of what the user gives an in-document
//! lease (lock field and collection names, documents to create, updates),
//! all made before anything is sent.

use mongodb::bson::{Bson, Document};

use crate::error::{Error, Result};

/// An update to a user's document under an in-document lease, as MongoDB's
/// `updateOne` takes; refused with
/// [`Error::InvalidUpdate`](crate::Error::InvalidUpdate) if empty or if it
/// writes the lock fields.
///
/// # Examples
///
/// ```
/// use mongodb::bson::doc;
/// use mongo_lease::DocumentUpdate;
///
/// // Update operators:
/// let update: DocumentUpdate = doc! { "$set": { "state": "done" }, "$inc": { "runs": 1 } }.into();
/// // An aggregation pipeline:
/// let update: DocumentUpdate = vec![doc! { "$set": { "runs": { "$add": ["$runs", 1] } } }].into();
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum DocumentUpdate {
    /// A document of update operators (`$set`, `$inc`, `$push`, ...). It
    /// must not write the lease's lock field.
    Modifiers(Document),
    /// An update pipeline (`$set`, `$unset`, `$replaceWith`, ... stages),
    /// run between the lease's own stages, which keep the lock field aside.
    /// It must not name a field or string starting with `__mongo_lease_`,
    /// and must keep `_id` and the document's other fields (`$$ROOT`), or
    /// the lease is lost with them (docs/in-document.md).
    Pipeline(Vec<Document>),
}

impl From<Document> for DocumentUpdate {
    fn from(update: Document) -> Self {
        DocumentUpdate::Modifiers(update)
    }
}

impl From<Vec<Document>> for DocumentUpdate {
    fn from(pipeline: Vec<Document>) -> Self {
        DocumentUpdate::Pipeline(pipeline)
    }
}

/// Checks a lock field name given to [`OpenDocuments::field`](crate::OpenDocuments::field).
pub(crate) fn check_field(field: &str) -> Result<()> {
    if field.is_empty()
        || field == "_id"
        || field.starts_with('$')
        || field.contains('.')
        || field.contains('\0')
    {
        return Err(Error::InvalidConfig {
            reason: format!(
                "the lock field must be a top-level field name other than _id, \
                 without '.', '$' prefix or NUL; got {field:?}"
            ),
        });
    }
    Ok(())
}

/// Checks a user collection's name given to [`LeaseManager::documents`]:
/// what MongoDB accepts as a collection name.
pub(crate) fn check_collection(collection: &str) -> Result<()> {
    if collection.is_empty()
        || collection.contains('$')
        || collection.contains('\0')
        || collection.starts_with("system.")
        || collection.starts_with('.')
        || collection.ends_with('.')
    {
        return Err(Error::InvalidConfig {
            reason: format!(
                "not a collection name MongoDB accepts: {collection:?} (empty, '$', NUL, \
                 a 'system.' prefix, or a leading or trailing '.')"
            ),
        });
    }
    Ok(())
}

/// Checks a document to create: no `_id` (it is the acquired one), no lock field.
pub(crate) fn check_create(create: &Document, field: &str) -> Result<()> {
    for name in ["_id", field] {
        if create.contains_key(name) {
            return Err(Error::InvalidUpdate {
                reason: format!("the document to create must not contain {name:?}"),
            });
        }
    }
    Ok(())
}

/// Checks a user's update: not empty; operators only (or a pipeline); no
/// path that is the lock field or inside it.
pub(crate) fn check_update(update: &DocumentUpdate, field: &str) -> Result<()> {
    let invalid = |reason: String| Err(Error::InvalidUpdate { reason });
    match update {
        DocumentUpdate::Modifiers(update) => {
            if update.is_empty() {
                return invalid("the update is empty".into());
            }
            for (operator, value) in update {
                if !operator.starts_with('$') {
                    return invalid(format!(
                        "{operator:?} is not an update operator: use {{\"$set\": {{...}}}} \
                         (a replacement document is not supported)"
                    ));
                }
                let Bson::Document(paths) = value else {
                    return invalid(format!("the value of {operator} must be a document"));
                };
                // `$rename` names a path in its values too; other
                // operators' values are the user's data.
                let renamed = paths
                    .values()
                    .filter(|_| operator == "$rename")
                    .filter_map(|v| v.as_str());
                for path in paths.keys().map(String::as_str).chain(renamed) {
                    let head = path.split('.').next().unwrap_or(path);
                    if head == field {
                        return invalid(format!(
                            "{operator} writes {path:?}, inside the lease's lock field {field:?}"
                        ));
                    }
                }
            }
            Ok(())
        }
        DocumentUpdate::Pipeline(stages) => {
            if stages.is_empty() {
                return invalid("the update pipeline is empty".into());
            }
            if let Some(name) = stages.iter().find_map(reserved_name_in) {
                return invalid(format!(
                    "the update pipeline names {name:?}: names starting with \
                     {RESERVED_PREFIX:?} are reserved for the lease's own stages"
                ));
            }
            Ok(())
        }
    }
}

/// The prefix of the temporary field that keeps the lock field while the
/// user's update pipeline runs (the store's `write_pipeline`): a user's
/// pipeline that wrote it would decide what the lock field becomes.
pub(crate) const RESERVED_PREFIX: &str = "__mongo_lease_";

/// The first field name or string in `document` (at any depth) that
/// contains [`RESERVED_PREFIX`].
fn reserved_name_in(document: &Document) -> Option<String> {
    fn in_value(value: &Bson) -> Option<String> {
        match value {
            Bson::String(s) if s.contains(RESERVED_PREFIX) => Some(s.clone()),
            Bson::Document(d) => reserved_name_in(d),
            Bson::Array(values) => values.iter().find_map(in_value),
            _ => None,
        }
    }
    document.iter().find_map(|(name, value)| {
        if name.contains(RESERVED_PREFIX) {
            Some(name.clone())
        } else {
            in_value(value)
        }
    })
}

#[cfg(test)]
mod tests;
