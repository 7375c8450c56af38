import { assertEquals } from "@std/assert";
import { sha256OfFile, sha256OfPath } from "../lib/util/sha256.ts";

Deno.test("sha256OfPath() and sha256OfFile(): FIPS 180-2's test vectors, and a file over several 1 MiB chunks", async () => {
  const dir = await Deno.makeTempDir({ prefix: "sha256_test_" });
  await Deno.writeTextFile(`${dir}/abc`, "abc");
  await Deno.writeFile(`${dir}/empty`, new Uint8Array());
  assertEquals(
    await sha256OfPath(`${dir}/abc`),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
  );
  assertEquals(
    await sha256OfPath(`${dir}/empty`),
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
  );
  // One million 'a's (FIPS 180-2, appendix B.3), written three times over: 3 MB, hashed from the start
  // even when the file was read to its end before.
  const million = new TextEncoder().encode("a".repeat(1_000_000));
  await Deno.writeFile(`${dir}/million`, million);
  assertEquals(
    await sha256OfPath(`${dir}/million`),
    "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
  );
  const three = new Uint8Array(3 * million.length);
  for (let i = 0; i < 3; i++) three.set(million, i * million.length);
  await Deno.writeFile(`${dir}/three`, three);
  using file = await Deno.open(`${dir}/three`);
  await file.read(new Uint8Array(10));
  const webCrypto = Array.from(
    new Uint8Array(await crypto.subtle.digest("SHA-256", three)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
  assertEquals(await sha256OfFile(file), webCrypto);
});
