//! The request body extractor every handler uses: actix-web's `Json`, with its configuration
//! (`http::json_config`: size limit, content types, refusals as `{error, code}`), reading the
//! body strictly ([`crate::strict`]): a struct from a JSON object only.

use std::ops::{Deref, DerefMut};

use actix_web::{FromRequest, HttpRequest, dev::Payload, web};
use futures_util::future::LocalBoxFuture;
use serde::de::DeserializeOwned;

use crate::strict::Strict;

/// A JSON request body of type `T`. Its name is the one utoipa recognises, so a handler's body
/// is documented from its argument, as with actix-web's own.
#[derive(Debug)]
pub struct Json<T>(pub T);

impl<T> Json<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> Deref for Json<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for Json<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T: DeserializeOwned + 'static> FromRequest for Json<T> {
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(request: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let body = web::Json::<Strict<T>>::from_request(request, payload);
        Box::pin(async move { Ok(Json(body.await?.into_inner().0)) })
    }
}
