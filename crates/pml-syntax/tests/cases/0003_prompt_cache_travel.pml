<schema name="travel">
<system>
You are a world-renowned travel planner ...
</system>
<user>
<module name="travel-plan"> I’m gearing up for a memorable escape ...
<parameter name="duration" length="5" />
...
<union scaffold="domestic">
<module name=domestic> My eyes are set ...
<parameter name="city" length="10" />
Given its domestic charm ...
</module>
<module name="overseas"> I’m yearning to tread ...
<union>
<module name="maldives">
The Maldives beckons ...
</module>
<module name="rome">
The eternal city of Rome...
</module>
</union>
</module>
</union>
</module>
</user>
<assistant>
I’d love to help. I’ve carefully read the city ...
</assistant>
</schema>
