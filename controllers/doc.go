// Package controllers holds the IdempotentConsumer reconciler.
package controllers
