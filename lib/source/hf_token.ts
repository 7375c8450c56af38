/**
 * Hugging Face access tokens for downloads: gated repositories (Llama, Gemma, Mistral) answer
 * 401/403 without one. `HF_TOKEN` is read as huggingface_hub, llama.cpp and vLLM read it, and
 * is sent only to Hugging Face's own hosts: a model URL elsewhere never sees it.
 */
import type { DownloadOptions } from "./download.ts";

/**
 * Hugging Face answers a `resolve/` URL with a redirect to one of its content hosts, so a
 * download from it needs those too.
 */
export const HUGGING_FACE_HOSTS = [
  "huggingface.co",
  "hf.co",
  "cdn-lfs.huggingface.co",
  "cdn-lfs.hf.co",
  "cdn-lfs-us-1.hf.co",
  "cas-bridge.xethub.hf.co",
] as const;

/** `HF_TOKEN` from the environment; undefined when unset, empty or not readable. */
export function hfTokenFromEnv(): string | undefined {
  try {
    const t = Deno.env.get("HF_TOKEN")?.trim();
    return t === "" ? undefined : t;
  } catch {
    // No --allow-env for it: downloads go without a token, and a refusal says how to give one.
    return undefined;
  }
}

/** Whether `url` is on one of Hugging Face's hosts. */
export function isHuggingFaceUrl(url: string): boolean {
  let host: string;
  try {
    host = new URL(url).hostname.toLowerCase();
  } catch {
    return false;
  }
  return (HUGGING_FACE_HOSTS as readonly string[]).includes(host);
}

/** The download options that give `url` the token, and say what to do when access is refused. */
export function hfAccess(
  url: string,
  token: string | undefined,
): Pick<DownloadOptions, "authorization" | "refusedHint"> {
  if (!isHuggingFaceUrl(url)) return {};
  return token === undefined
    ? {
      refusedHint: "the repository is gated or private: accept its terms on its Hugging Face " +
        "page, then set HF_TOKEN to an access token with read permission",
    }
    : {
      authorization: `Bearer ${token}`,
      refusedHint: "HF_TOKEN was sent and refused: check that the token is valid, has read " +
        "permission, and that its account accepted the repository's terms on its page",
    };
}
