import { ErrorBody } from '@dsec/sdk/schema';

/** The error statuses every /v1 route may answer with, for the OpenAPI document. */
export const errorResponses = {
  400: ErrorBody,
  401: ErrorBody,
  403: ErrorBody,
  404: ErrorBody,
  409: ErrorBody,
  413: ErrorBody,
  429: ErrorBody,
  500: ErrorBody,
  503: ErrorBody,
};
